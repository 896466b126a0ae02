"""RL fan-out: warm an environment once, fork it N times, run a different
policy in each fork at once, score them, keep the best.

The environment is a Python server in the sandbox that loads a data set
into memory at start (the slow part) and then scores the policies sent to
it. It is warmed once and checkpointed *running*; each fork gets a copy of
the live server, data already in memory, and the policies run in parallel
with the asyncio client. Every fork's server counts the episodes it
served: each says 1, since each has its own copy of the process.

Run it as root with a daemon running (``SANDTREE_SOCKET`` names its socket
when it is not the default)::

    python examples/rl_fanout.py
"""

from __future__ import annotations

import asyncio
import json
import time

from sandtree import AsyncSandbox, AsyncSandtree

POLICIES = [2.0, 2.5, 2.9, 3.0, 3.2, 4.0]
"""Each policy predicts ``y = w * x``; the environment's data follows ``y ≈ 3x``."""

ENV_SERVER = """
import json, random, socket

# The slow start: build the data set (a real environment would load a
# simulator, a model, a corpus). What stays in memory is small; what took
# time is the work.
rng = random.Random(0)
data = []
for _ in range(50_000):
    x = rng.uniform(0, 10)
    noise = sum(rng.gauss(0, 1) for _ in range(64)) / 8  # costly on purpose
    data.append((x, 3.0 * x + noise))
episodes = 0

server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 7000))
server.listen()
print(f"ready: {len(data)} samples loaded", flush=True)
while True:
    conn, _ = server.accept()
    w = json.loads(conn.recv(1024))["w"]
    episodes += 1
    loss = sum((y - w * x) ** 2 for x, y in data) / len(data)
    conn.sendall(json.dumps({"reward": -loss, "episode": episodes}).encode())
    conn.close()
"""

POLICY = """
import json, socket, sys
conn = socket.create_connection(("127.0.0.1", 7000))
conn.sendall(json.dumps({"w": float(sys.argv[1])}).encode())
print(conn.recv(1024).decode())
"""


async def warm_up(sb: AsyncSandbox) -> float:
    """Starts the environment server and waits until its data is loaded;
    returns the seconds it took."""
    started = time.monotonic()
    await sb.files.write("/root/env_server.py", ENV_SERVER)
    await sb.files.write("/root/policy.py", POLICY)
    server = await sb.spawn(["python3", "/root/env_server.py"])
    while b"ready" not in (out := await server.output()).stdout:
        if not out.process.running:
            raise RuntimeError(f"the environment server exited: {out.stderr_text}")
        await asyncio.sleep(0.05)
    return time.monotonic() - started


async def run_policy(fork: AsyncSandbox, w: float) -> tuple[float, float, int]:
    result = (await fork.exec(["python3", "/root/policy.py", str(w)], timeout=60)).check()
    answer = json.loads(result.text)
    return w, answer["reward"], answer["episode"]


async def main() -> None:
    async with AsyncSandtree() as client, client.create(labels={"example": "rl_fanout"}) as sb:
        warm_s = await warm_up(sb)
        print(f"environment warmed in {warm_s:.2f} s (in {sb.id})")

        ck = await sb.checkpoint("warm")
        started = time.monotonic()
        forks = await ck.fork(len(POLICIES), labels={"example": "rl_fanout"})
        print(
            f"forked {len(forks)} sandboxes with the live server in {time.monotonic() - started:.2f} s (none warms up again)"
        )
        try:
            started = time.monotonic()
            results = await asyncio.gather(*(run_policy(f, w) for f, w in zip(forks, POLICIES)))
            print(f"ran {len(results)} policies in parallel in {time.monotonic() - started:.2f} s")
            for fork, (w, reward, episode) in zip(forks, results):
                print(f"  {fork.id}  w={w:<4}  reward={reward:9.3f}  episode={episode}")
            assert all(episode == 1 for _, _, episode in results), "each fork has its own server"
            best_w, best_reward, _ = max(results, key=lambda r: r[1])
            print(f"best policy: w={best_w} (reward {best_reward:.3f})")
        finally:
            await asyncio.gather(*(f.delete() for f in forks))
        print(f"deleted the {len(forks)} forks; checkpoint {ck.id} goes with {sb.id}")


if __name__ == "__main__":
    asyncio.run(main())
