"""Monte-Carlo tree search over a live sandbox: checkpoint at a node, try a
child, roll back.

The toy task: a shell in a sandbox holds a number ``N`` (a shell variable of
a live bash, not a file) and keeps a log file of the moves made. A move
(``+1``, ``+5``, ``*2``, ``*3``, ``-2``) changes both. Reach ``TARGET`` from 1
in at most ``DEPTH`` moves.

Each tree node is a checkpoint of the sandbox; visiting a node is a
rollback to it, which brings back the shell with its variable and the log
file with its lines, in a few milliseconds. A random playout from a new
node runs the moves for real in the shell, scores the result, and is
undone by the next rollback. At the end the best sequence found is
replayed from the root and checked.

Run it as root with a daemon running (``SANDTREE_SOCKET`` names its socket
when it is not the default)::

    python examples/mcts.py
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field

from sandtree import Checkpoint, Sandbox, Sandtree, Session

TARGET = 42
DEPTH = 5
# The daemon keeps the live processes of a sandbox's last 64 checkpoints
# ready for an instant rollback; a tree of at most ITERATIONS + 1 nodes stays
# within that (older ones restore from their disk image, which does not
# hold a terminal, such as a session's, yet).
ITERATIONS = 60
MOVES = {"+1": "N=$((N+1))", "+3": "N=$((N+3))", "*2": "N=$((N*2))", "*3": "N=$((N*3))", "-1": "N=$((N-1))"}
EXPLORATION = 0.7


@dataclass
class Node:
    """A state of the sandbox, kept as a checkpoint."""

    checkpoint: Checkpoint
    moves: tuple[str, ...]
    parent: Node | None = None
    children: dict[str, Node] = field(default_factory=dict)
    visits: int = 0
    total: float = 0.0

    def untried(self) -> list[str]:
        return [m for m in MOVES if m not in self.children] if len(self.moves) < DEPTH else []

    def uct_child(self) -> Node:
        return max(
            self.children.values(),
            key=lambda c: c.total / c.visits + EXPLORATION * math.sqrt(math.log(self.visits) / c.visits),
        )


def play(session: Session, move: str) -> int:
    """Makes a move in the live shell; returns the new number."""
    return int(session.run(f"{MOVES[move]}; echo '{move} -> '$N >> /root/moves.log; echo $N").check().text)


def value(session: Session) -> int:
    return int(session.run("echo $N").check().text)


def score(n: int) -> float:
    return max(0.0, 1.0 - abs(n - TARGET) / TARGET)


def search(sb: Sandbox, session: Session, rng: random.Random) -> tuple[tuple[str, ...], int, int]:
    """Runs the search; returns the best moves found, their value, and the
    number of rollbacks made."""
    root = Node(sb.checkpoint("root"), ())
    best: tuple[tuple[str, ...], int] = ((), value(session))
    rollbacks = 0
    for _ in range(ITERATIONS):
        # Selection: down the tree by UCT to a node with an untried move.
        node = root
        while not node.untried() and node.children:
            node = node.uct_child()
        sb.rollback(node.checkpoint)
        rollbacks += 1
        # Expansion: try one new move and keep the state as a child node.
        n = value(session)
        if node.untried():
            move = rng.choice(node.untried())
            n = play(session, move)
            child = Node(sb.checkpoint(label=" ".join(node.moves + (move,))), node.moves + (move,), node)
            node.children[move] = child
            node = child
        # Playout: random moves, for real, up to the depth.
        moves = node.moves
        if abs(n - TARGET) < abs(best[1] - TARGET):
            best = (moves, n)
        while len(moves) < DEPTH and n != TARGET:
            move = rng.choice(list(MOVES))
            n = play(session, move)
            moves += (move,)
            if abs(n - TARGET) < abs(best[1] - TARGET):
                best = (moves, n)
        # Backpropagation.
        reward = score(n)
        walk: Node | None = node
        while walk is not None:
            walk.visits += 1
            walk.total += reward
            walk = walk.parent
        if best[1] == TARGET:
            break
    sb.rollback(root.checkpoint)
    rollbacks += 1
    return best[0], best[1], rollbacks


def main() -> None:
    rng = random.Random(3)
    started = time.monotonic()
    with Sandtree() as client, client.create(labels={"example": "mcts"}) as sb, sb.session() as session:
        session.run("N=1; : > /root/moves.log").check()
        moves, reached, rollbacks = search(sb, session, rng)
        tree = sb.checkpoints()
        print(f"searched {len(tree)} states ({rollbacks} rollbacks) in {time.monotonic() - started:.1f} s")
        print(f"best: {' '.join(moves) or '(no move)'} -> {reached} (target {TARGET})")

        # After the final rollback the sandbox is at the root again:
        # the shell's N is 1 and the log is empty, whatever the playouts did.
        assert value(session) == 1
        assert sb.files.read_text("/root/moves.log") == ""
        for move in moves:
            play(session, move)
        assert value(session) == reached, "the replay must reach what the search saw"
        print("replayed from the root:")
        print(sb.files.read_text("/root/moves.log"), end="")
        print(f"checkpoint tree (first lines of {len(tree)}):")
        print("\n".join(tree.render().splitlines()[:8]))


if __name__ == "__main__":
    main()
