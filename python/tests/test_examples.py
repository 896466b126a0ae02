"""The examples run as a user runs them: a subprocess, the daemon's socket
in SANDTREE_SOCKET."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import sandtree

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, socket_path: str) -> str:
    env = {**os.environ, "SANDTREE_SOCKET": socket_path}
    env.pop("SANDTREE_URL", None)
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"{name} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_mcts(socket_path: str, client: sandtree.Sandtree) -> None:
    out = run_example("mcts.py", socket_path)
    assert "searched " in out and " rollbacks) in " in out
    best = next(line for line in out.splitlines() if line.startswith("best: "))
    assert best.endswith("(target 42)")
    reached = int(best.split("->")[1].split()[0])
    # The replay log ends with the number the search reported.
    replay = out.split("replayed from the root:\n")[1].splitlines()
    assert replay[0].split("->")[0].strip() in ("+1", "+3", "*2", "*3", "-1")
    moves = best[len("best: ") : best.index("->")].split()
    assert [line.split("->")[0].strip() for line in replay[: len(moves)]] == moves
    assert int(replay[len(moves) - 1].split("->")[1]) == reached
    assert '"root"' in out
    assert client.list(labels={"example": "mcts"}) == []


def test_rl_fanout(socket_path: str, client: sandtree.Sandtree) -> None:
    out = run_example("rl_fanout.py", socket_path)
    assert "environment warmed in" in out
    assert "forked 6 sandboxes with the live server" in out
    rows = [line for line in out.splitlines() if "reward=" in line]
    assert len(rows) == 6
    assert all(line.rstrip().endswith("episode=1") for line in rows)
    assert "best policy: w=3.0" in out
    assert client.list(labels={"example": "rl_fanout"}) == []
