"""The files API: read and write without running a program in the sandbox."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
from pathlib import Path

import httpx
import pytest

import sandtree
from conftest import Daemon


def test_write_and_read_bytes(sandbox: sandtree.Sandbox) -> None:
    data = bytes(range(256)) * 100 + os.urandom(10_000)
    info = sandbox.files.write("/root/data.bin", data)
    assert info.path == "/root/data.bin"
    assert info.name == "data.bin"
    assert info.kind == "file" and info.is_file
    assert info.size == len(data)
    assert info.mode == "644"
    assert (info.uid, info.gid) == (0, 0)
    assert sandbox.files.read("/root/data.bin") == data
    # The sandbox's programs see the same bytes.
    digest = sandbox.exec(["sha256sum", "/root/data.bin"]).check().text.split()[0]
    assert digest == hashlib.sha256(data).hexdigest()


def test_write_text_and_read_text(sandbox: sandtree.Sandbox) -> None:
    sandbox.files.write("/tmp/hello.txt", "héllo wörld\n")
    assert sandbox.files.read("/tmp/hello.txt") == "héllo wörld\n".encode()
    assert sandbox.files.read_text("/tmp/hello.txt") == "héllo wörld\n"
    assert sandbox.exec(["cat", "/tmp/hello.txt"]).check().text == "héllo wörld\n"


def test_empty_file(sandbox: sandtree.Sandbox) -> None:
    assert sandbox.files.write("/root/empty", b"").size == 0
    assert sandbox.files.read("/root/empty") == b""


def test_write_20_mb_streamed_from_a_file_object(sandbox: sandtree.Sandbox, tmp_path: Path) -> None:
    local = tmp_path / "big.bin"
    data = os.urandom(20 * 1024 * 1024)
    local.write_bytes(data)
    with open(local, "rb") as f:
        info = sandbox.files.write("/root/big.bin", f)
    assert info.size == len(data)
    digest = sandbox.exec(["sha256sum", "/root/big.bin"]).check().text.split()[0]
    assert digest == hashlib.sha256(data).hexdigest()
    assert sandbox.files.read("/root/big.bin") == data


def test_write_from_an_unsized_stream(sandbox: sandtree.Sandbox) -> None:
    # An iterable has no known length: the body goes chunked.
    parts = [os.urandom(100_000) for _ in range(5)]
    info = sandbox.files.write("/root/chunks.bin", iter(parts))
    assert info.size == 500_000
    assert sandbox.files.read("/root/chunks.bin") == b"".join(parts)


def test_write_makes_parents_and_replaces(sandbox: sandtree.Sandbox) -> None:
    sandbox.files.write("/root/a/b/c.txt", "one")
    assert sandbox.files.stat("/root/a/b").is_dir
    sandbox.files.write("/root/a/b/c.txt", "two")
    assert sandbox.files.read_text("/root/a/b/c.txt") == "two"


def test_mode_and_user(sandbox: sandtree.Sandbox) -> None:
    script = sandbox.files.write("/root/run.sh", "#!/bin/sh\necho ran\n", mode=0o755)
    assert script.mode == "755"
    assert sandbox.exec(["/root/run.sh"]).check().text == "ran\n"
    assert sandbox.files.write("/root/secret", "s", mode="600").mode == "600"
    owned = sandbox.files.write("/tmp/nobody.txt", "n", user="nobody")
    assert owned.uid == 65534
    assert sandbox.exec(["stat", "-c", "%U %a", "/tmp/nobody.txt"]).check().text == "nobody 644\n"
    # A replaced file keeps its mode unless one is given.
    assert sandbox.files.write("/root/run.sh", "#!/bin/sh\necho again\n").mode == "755"


def test_relative_paths_are_under_home(sandbox: sandtree.Sandbox) -> None:
    info = sandbox.files.write("notes/todo.txt", "relative")
    assert info.path == "/root/notes/todo.txt"
    assert sandbox.files.read_text("/root/notes/todo.txt") == "relative"
    assert sandbox.files.read_text("notes/todo.txt") == "relative"
    assert sandbox.files.stat("notes").path == "/root/notes"


def test_paths_stay_inside_the_sandbox(sandbox: sandtree.Sandbox) -> None:
    sandbox.exec("ln -s /etc /root/etc-link").check()
    escaped = sandbox.files.read_text("/root/etc-link/hostname")
    assert escaped == sandbox.exec(["cat", "/etc/hostname"]).check().text
    assert sandbox.files.stat("/root/etc-link").kind == "symlink"
    assert sandbox.files.stat("/root/etc-link").symlink_target == "/etc"
    dotdot = sandbox.files.read_text("/../../../etc/hostname")
    assert dotdot == escaped


def test_stat_list_mkdir_move_remove(sandbox: sandtree.Sandbox) -> None:
    files = sandbox.files
    made = files.mkdir("/root/proj/src")
    assert made.kind == "dir" and made.path == "/root/proj/src"
    assert files.mkdir("/root/proj/src").is_dir  # as mkdir -p: fine if it exists
    with pytest.raises(sandtree.ConflictError) as info:
        files.mkdir("/root/proj/src", parents=False)
    assert info.value.code == "already_exists"
    with pytest.raises(sandtree.NotFoundError):
        files.mkdir("/root/none/deeper", parents=False)
    assert files.mkdir("/root/proj/private", mode=0o700).mode == "700"

    files.write("/root/proj/src/main.py", "print('hi')\n")
    files.write("/root/proj/README", "readme")

    top = files.list("/root/proj")
    assert [(e.name, e.kind) for e in top] == [("README", "file"), ("private", "dir"), ("src", "dir")]
    deep = files.list("/root/proj", depth=2)
    assert [e.path for e in deep] == [
        "/root/proj/README",
        "/root/proj/private",
        "/root/proj/src",
        "/root/proj/src/main.py",
    ]
    assert files.stat("/root/proj/src/main.py").size == len("print('hi')\n")

    moved = files.move("/root/proj/src/main.py", "/root/proj/app.py")
    assert moved.path == "/root/proj/app.py"
    assert not files.exists("/root/proj/src/main.py")
    assert files.read_text("/root/proj/app.py") == "print('hi')\n"
    with pytest.raises(sandtree.ConflictError):
        files.move("/root/proj/README", "/root/proj/app.py")
    files.move("/root/proj/README", "/root/proj/app.py", overwrite=True)
    assert files.read_text("/root/proj/app.py") == "readme"

    files.remove("/root/proj/app.py")
    assert not files.exists("/root/proj/app.py")
    with pytest.raises(sandtree.SandtreeError):
        files.remove("/root/proj")  # not empty
    files.remove("/root/proj", recursive=True)
    assert not files.exists("/root/proj")
    assert sandbox.exec(["test", "-e", "/root/proj"]).exit_code == 1


def test_file_not_found(sandbox: sandtree.Sandbox) -> None:
    for call in (
        lambda: sandbox.files.read("/root/missing.txt"),
        lambda: sandbox.files.stat("/root/missing.txt"),
        lambda: sandbox.files.list("/root/missing-dir"),
        lambda: sandbox.files.remove("/root/missing.txt"),
        lambda: sandbox.files.move("/root/missing.txt", "/root/x"),
    ):
        with pytest.raises(sandtree.NotFoundError) as info:
            call()
        assert info.value.code == "file_not_found"
        assert info.value.status == 404
    assert not sandbox.files.exists("/root/missing.txt")


def test_files_of_an_unknown_sandbox(client: sandtree.Sandtree) -> None:
    sb = client.create()
    sb.delete()
    with pytest.raises(sandtree.NotFoundError) as info:
        sb.files.exists("/etc/hostname")
    assert info.value.code == "sandbox_not_found"


def test_files_follow_checkpoint_and_rollback(sandbox: sandtree.Sandbox) -> None:
    sandbox.files.write("/root/doc.txt", "v1")
    ck = sandbox.checkpoint()
    sandbox.files.write("/root/doc.txt", "v2")
    sandbox.files.write("/root/extra.txt", "extra")
    sandbox.rollback(ck)
    assert sandbox.files.read_text("/root/doc.txt") == "v1"
    assert not sandbox.files.exists("/root/extra.txt")


def test_files_of_a_stopped_sandbox(sandbox: sandtree.Sandbox) -> None:
    sandbox.files.write("/root/keep.txt", "kept")
    sandbox.stop()
    assert sandbox.files.read_text("/root/keep.txt") == "kept"
    sandbox.files.write("/root/while-stopped.txt", io.BytesIO(b"written"))
    sandbox.start()
    assert sandbox.exec(["cat", "/root/while-stopped.txt"]).check().text == "written"


def test_metadata_is_stored_on_the_file_and_rolls_back(sandbox: sandtree.Sandbox) -> None:
    info = sandbox.files.write("/root/m.txt", "m", metadata={"Owner": "me", "step": "1"})
    assert info.metadata == {"owner": "me", "step": "1"}
    assert sandbox.files.stat("/root/m.txt").metadata == {"owner": "me", "step": "1"}
    assert {e.name: e.metadata for e in sandbox.files.list("/root")}["m.txt"] == {"owner": "me", "step": "1"}
    # As extended attributes, which the sandbox's programs read.
    got = sandbox.exec(["python3", "-c", "import os; print(os.getxattr('/root/m.txt', 'user.e2b.step').decode())"])
    assert got.check().text.strip() == "1"
    ck = sandbox.checkpoint()
    assert sandbox.files.write("/root/m.txt", "n", metadata={"step": "2"}).metadata == {"step": "2"}
    assert sandbox.files.write("/root/m.txt", "o").metadata == {}
    sandbox.rollback(ck)
    assert sandbox.files.stat("/root/m.txt").metadata == {"owner": "me", "step": "1"}
    # A name that is not UTF-8 is listed, with its metadata.
    made = "import os; open(b'/root/nu/\\xff', 'w').close(); os.setxattr(b'/root/nu/\\xff', 'user.e2b.k', b'v')"
    sandbox.exec(["sh", "-c", "mkdir -p /root/nu"]).check()
    sandbox.exec(["python3", "-c", made]).check()
    assert [e.metadata for e in sandbox.files.list("/root/nu")] == [{"k": "v"}]
    with pytest.raises(sandtree.InvalidArgumentError, match="metadata key"):
        sandbox.files.write("/root/bad.txt", "x", metadata={"a b": "c"})
    assert not sandbox.files.exists("/root/bad.txt")


def test_gzip_uploads_are_decoded(sandbox: sandtree.Sandbox, daemon: Daemon) -> None:
    data = bytes(range(256)) * 4096 + os.urandom(100_000)
    url = f"http://sandtree/v1/sandboxes/{sandbox.id}/files"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(daemon.socket))) as http:
        headers = {"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"}
        r = http.put(url, params={"path": "/root/z.bin"}, content=gzip.compress(data), headers=headers)
        assert r.status_code == 200, r.text
        assert r.json()["size"] == len(data)
        assert sandbox.files.read("/root/z.bin") == data
        # Not gzip, or cut short: refused, and the old file stays whole.
        r = http.put(url, params={"path": "/root/z.bin"}, content=b"not gzip at all", headers=headers)
        assert r.status_code == 400 and "not gzip" in r.json()["error"]["message"], r.text
        r = http.put(url, params={"path": "/root/z.bin"}, content=gzip.compress(data)[:-100], headers=headers)
        assert r.status_code == 400 and "stops short" in r.json()["error"]["message"], r.text
        assert sandbox.files.read("/root/z.bin") == data
