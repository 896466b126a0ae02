"""The asyncio client mirrors the sync one; concurrent calls work."""

from __future__ import annotations

import asyncio
import hashlib
import io
import os
from collections.abc import AsyncIterator

import sandtree
from sandtree import AsyncSandtree, ExitEvent, StartedEvent, StdoutEvent


def test_async_exec_checkpoint_and_gathered_forks(socket_path: str) -> None:
    async def main() -> None:
        async with AsyncSandtree(socket_path) as client, client.create(labels={"test": "async"}) as sb:
            assert isinstance(sb, sandtree.AsyncSandbox)
            data = os.urandom(100_000)
            result = await sb.exec(["sha256sum"], stdin=data)
            assert result.check().text.split()[0] == hashlib.sha256(data).hexdigest()

            await sb.exec("echo base > /root/base.txt")
            ck = await sb.checkpoint("base")
            forks = await ck.fork(3)
            assert len(forks) == 3
            try:
                await asyncio.gather(*(f.exec(f"echo {i} > /root/mine.txt") for i, f in enumerate(forks)))
                results = await asyncio.gather(*(f.exec("cat /root/base.txt /root/mine.txt") for f in forks))
                assert [r.check().text for r in results] == [f"base\n{i}\n" for i in range(3)]
                tree = await sb.checkpoints()
                assert [c.id for c in tree] == [ck.id]
            finally:
                await asyncio.gather(*(f.delete() for f in forks))
            sid = sb.id
        async with AsyncSandtree(socket_path) as client:
            assert sid not in [s.id for s in await client.list()]

    asyncio.run(main())


def test_async_many_concurrent_execs(socket_path: str) -> None:
    async def main() -> None:
        async with AsyncSandtree(socket_path) as client:
            sb = await client.create()
            async with sb:
                results = await asyncio.gather(*(sb.exec(["sh", "-c", f"sleep 0.2; echo {i}"]) for i in range(20)))
                assert [r.text for r in results] == [f"{i}\n" for i in range(20)]

    asyncio.run(main())


def test_async_stream_processes_and_sessions(socket_path: str) -> None:
    async def main() -> None:
        async with AsyncSandtree(socket_path) as client, client.create() as sb:
            events = [e async for e in sb.exec_stream("echo a; sleep 0.1; echo b")]
            assert isinstance(events[0], StartedEvent)
            assert isinstance(events[-1], ExitEvent) and events[-1].result.ok
            assert b"".join(e.data for e in events if isinstance(e, StdoutEvent)) == b"a\nb\n"

            process = await sb.spawn("echo bg; sleep 30")
            assert [p.pid for p in await sb.processes()] == [process.pid]
            while b"bg" not in (await process.output()).stdout:
                await asyncio.sleep(0.02)
            await process.kill()
            final = await process.wait(timeout=10)
            assert final.process.signal == 9 and final.stdout == b"bg\n"

            async with await sb.session(cwd="/tmp") as session:
                await session.run("Y=async")
                assert (await session.run("echo $Y $(pwd)")).text == "async /tmp\n"

            info = await client.info()
            assert info.sandboxes >= 1

    asyncio.run(main())


def test_async_files(socket_path: str) -> None:
    async def main() -> None:
        async with AsyncSandtree(socket_path) as client, client.create() as sb:
            data = os.urandom(3 * 1024 * 1024)
            written = await sb.files.write("/root/blob.bin", io.BytesIO(data))
            assert written.size == len(data)
            assert await sb.files.read("/root/blob.bin") == data

            async def chunks() -> AsyncIterator[bytes]:
                for part in (b"one ", b"two ", b"three"):
                    yield part

            await sb.files.write("words.txt", chunks())
            assert await sb.files.read_text("/root/words.txt") == "one two three"
            assert await sb.files.exists("/root/words.txt")
            await sb.files.remove("words.txt")
            assert not await sb.files.exists("/root/words.txt")
            names = [e.name for e in await sb.files.list("/root")]
            assert "blob.bin" in names

    asyncio.run(main())
