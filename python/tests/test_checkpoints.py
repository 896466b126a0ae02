"""Checkpoint, rollback and fork: files and live processes."""

from __future__ import annotations

import pytest

import sandtree
from conftest import start_counter

# One connection to the counter server (`conftest.start_counter`): the next
# value of the counter its memory holds.
HIT = "import socket; print(socket.create_connection(('127.0.0.1', 7000)).recv(16).decode())"


def hit(sb: sandtree.Sandbox) -> int:
    return int(sb.exec(["python3", "-c", HIT], timeout=10).check().text)


def test_rollback_restores_files_and_a_live_python_process(sandbox: sandtree.Sandbox) -> None:
    server = start_counter(sandbox)
    sandbox.exec("echo original > /root/state.txt").check()
    assert hit(sandbox) == 1

    ck = sandbox.checkpoint("one-hit", labels={"step": "1"})
    assert ck.process_state == "captured"
    assert server.pid in ck.processes
    assert ck.label == "one-hit" and ck.labels == {"step": "1"}
    assert ck.note and "captured" in ck.note
    assert sandbox.base_checkpoint == ck.id

    sandbox.exec("echo changed > /root/state.txt; touch /root/new.txt").check()
    assert hit(sandbox) == 2
    assert hit(sandbox) == 3

    result = sandbox.rollback(ck)
    assert result.processes == "restored"
    assert server.pid in result.restored_pids
    assert result.checkpoint == ck.id
    assert not result.processes_restarted
    assert sandbox.status == "running"

    assert sandbox.exec(["cat", "/root/state.txt"]).check().text == "original\n"
    assert sandbox.exec(["test", "-e", "/root/new.txt"]).exit_code == 1
    # The server's memory is as at the checkpoint: one hit so far.
    assert hit(sandbox) == 2
    assert server.poll().running


def test_rollback_restores_a_session_variable(sandbox: sandtree.Sandbox) -> None:
    with sandbox.session() as session:
        session.run("cd /tmp; X=1").check()
        ck = sandbox.checkpoint()
        session.run("cd /; X=2").check()
        assert session.run("echo $X").text == "2\n"
        sandbox.rollback(ck.id)
        assert session.run("echo $X $(pwd)").text == "1 /tmp\n"


def test_checkpoint_tree(client: sandtree.Sandtree, sandbox: sandtree.Sandbox) -> None:
    root = sandbox.checkpoint("root")
    left = sandbox.checkpoint("left")
    sandbox.rollback(root)
    right = sandbox.checkpoint("right", wait_durable=True)
    assert right.process_image is None or right.process_image.state in ("durable", "failed")

    tree = sandbox.checkpoints()
    assert [c.id for c in tree] == [root.id, left.id, right.id]
    assert tree.get(left.id).parent == root.id
    assert tree.get(right.id).parent == root.id
    assert [c.id for c in tree.roots()] == [root.id]
    assert sorted(c.id for c in tree.children(root)) == sorted([left.id, right.id])
    assert tree.parent(left) == root
    assert [c.id for c in tree.ancestors(right)] == [root.id]
    assert left.id in tree

    text = tree.render(marks={right.id: [sandbox.id]})
    lines = text.splitlines()
    assert lines[0].startswith(root.id) and '"root"' in lines[0]
    assert lines[1].startswith("├── " + left.id)
    assert lines[2].startswith("└── " + right.id) and lines[2].endswith("◀ " + sandbox.id)

    assert client.checkpoint(left.id) == left
    assert left.id in client.checkpoints()
    assert left.refresh().label == "left"

    # A checkpoint with a child cannot go without force; a leaf can.
    with pytest.raises(sandtree.ConflictError) as info:
        root.delete()
    assert info.value.code == "checkpoint_in_use"
    assert left.delete().deleted == (left.id,)
    with pytest.raises(sandtree.NotFoundError):
        client.checkpoint(left.id)


def test_fork_four_sandboxes_that_diverge(client: sandtree.Sandtree, sandbox: sandtree.Sandbox) -> None:
    server = start_counter(sandbox)
    sandbox.exec("mkdir -p /root/work && echo base > /root/work/base.txt").check()
    assert hit(sandbox) == 1
    ck = sandbox.checkpoint("warm")

    forks = ck.fork(4, labels={"role": "branch"})
    try:
        assert len(forks) == 4
        assert len({f.id for f in forks}) == 4
        for i, fork in enumerate(forks):
            assert fork.id != sandbox.id
            assert fork.labels == {"role": "branch"}
            assert fork.base_checkpoint == ck.id
            assert server.pid in fork.restored_pids
            fork.exec(f"echo {i} > /root/work/mine.txt").check()
            for _ in range(i):
                hit(fork)
        for i, fork in enumerate(forks):
            listing = fork.exec(["ls", "/root/work"]).check().text.split()
            assert listing == ["base.txt", "mine.txt"]
            assert fork.exec(["cat", "/root/work/mine.txt"]).check().text == f"{i}\n"
            # Each fork has its own copy of the server's memory.
            assert hit(fork) == 2 + i
        assert sandbox.exec(["ls", "/root/work"]).check().text.split() == ["base.txt"]
        assert hit(sandbox) == 2
        assert {f.id for f in client.list(labels={"role": "branch"})} == {f.id for f in forks}
    finally:
        for fork in forks:
            fork.delete()
    assert client.list(labels={"role": "branch"}) == []


def test_fork_files_only(sandbox: sandtree.Sandbox) -> None:
    start_counter(sandbox)
    sandbox.exec("echo kept > /root/f.txt").check()
    ck = sandbox.checkpoint()
    (fork,) = ck.fork(1, files_only=True)
    with fork:
        assert fork.restored_pids == ()
        assert fork.exec(["cat", "/root/f.txt"]).check().text == "kept\n"
        assert fork.exec(["python3", "-c", HIT]).exit_code != 0  # no server in a files-only fork


def test_fork_of_an_unrestorable_checkpoint_is_a_conflict(sandbox: sandtree.Sandbox) -> None:
    # A session's shell holds a terminal, which a fork cannot copy yet.
    with sandbox.session() as session:
        session.run("true")
        ck = sandbox.checkpoint()
        with pytest.raises(sandtree.ConflictError) as info:
            ck.fork(2)
        assert info.value.code == "processes_lost"
        assert info.value.status == 409
        assert "files_only=True" in info.value.message


def test_stop_start_and_info(sandbox: sandtree.Sandbox) -> None:
    described = sandbox.info()
    assert described.id == sandbox.id
    assert described.usage is not None and described.usage.pids >= 1
    assert sandbox.stop().status == "stopped"
    assert sandbox.refresh().status == "stopped"
    assert sandbox.start().status == "running"
    assert sandbox.exec("echo up").check().text == "up\n"


def test_delete_keeps_or_removes_checkpoints(client: sandtree.Sandtree) -> None:
    sb = client.create()
    ck = sb.checkpoint("survivor")
    result = sb.delete()
    assert result.id == sb.id
    assert [k.id for k in result.checkpoints_kept] == [ck.id]
    assert client.checkpoint(ck.id).sandbox_id == sb.id
    assert ck.delete().deleted == (ck.id,)

    sb2 = client.create()
    ck2 = sb2.checkpoint()
    result2 = sb2.delete(checkpoints=True)
    assert result2.checkpoints_deleted == (ck2.id,)


def test_inspect_process_image(sandbox: sandtree.Sandbox) -> None:
    server = start_counter(sandbox)
    ck = sandbox.checkpoint(wait_durable=True)
    assert ck.process_image is not None and ck.process_image.state == "durable"
    summary = ck.inspect()
    assert summary.checkpoint == ck.id
    assert server.pid in [p.pid for p in summary.processes]
    assert any(p.comm.startswith("python3") for p in summary.processes)
