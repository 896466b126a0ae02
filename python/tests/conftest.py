"""Fixtures: a private Sandtree daemon for the whole test session.

The daemon is the real binary (``SANDTREE_BIN``, else the repository's
``target/release/sandtree``, else ``target/debug/sandtree``), run as root on
a scratch data directory ``/var/tmp/sandtree-pytest-<pid>`` with a cgroup of
its own. At the end it is stopped (SIGTERM, then SIGKILL) and everything it
may have left is removed, as the Rust end-to-end harness does
(``crates/sandtree/tests/common/mod.rs``): the mounts under the data
directory, the directory, and its cgroups.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket as socketlib
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import sandtree

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0


@dataclass
class Daemon:
    """A running test daemon."""

    binary: Path
    dir: Path
    socket: Path
    url: str
    """Its TCP listener (on the loopback), which needs the bearer token."""
    cgroup: str
    process: subprocess.Popen[bytes]
    e2b_url: str
    """Its E2B door (``--e2b``, on the loopback): control plane and envd."""

    @property
    def token(self) -> str:
        return (self.dir / "token").read_text().strip()

    def log(self) -> str:
        try:
            return (self.dir / "daemon.log").read_text(errors="replace")
        except OSError:
            return ""


def _binary() -> Path:
    explicit = os.environ.get("SANDTREE_BIN")
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            pytest.fail(f"SANDTREE_BIN={explicit} is not a file")
        return path
    for build in ("release", "debug"):
        path = REPO / "target" / build / "sandtree"
        if path.is_file():
            return path
    pytest.fail("no sandtree binary: set SANDTREE_BIN or build one (cargo build --release)")


def _unescape_mount(field: str) -> str:
    """A /proc/mounts path field, with its octal escapes (``\\040``) decoded."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _unmount_under(root: Path) -> None:
    """Lazily unmounts every mount at or under ``root``, longest path first."""
    prefix = str(root)
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return
    targets = {
        target
        for target in (_unescape_mount(line.split()[1]) for line in lines if len(line.split()) > 1)
        if target == prefix or target.startswith(prefix + "/")
    }
    for target in sorted(targets, key=len, reverse=True):
        subprocess.run(["umount", "-l", target], stderr=subprocess.DEVNULL, check=False)


def _remove_cgroup_tree(directory: Path) -> None:
    """Depth first: thaw, kill the members, drop memory charges, rmdir."""
    for child in directory.iterdir():
        if child.is_dir() and not child.is_symlink():
            _remove_cgroup_tree(child)
    for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
        try:
            (directory / name).write_text(value)
        except OSError:
            pass
    deadline = time.monotonic() + 5
    while True:
        try:
            pids = [int(p) for p in (directory / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if not pids:
            try:
                (directory / "memory.force_empty").write_text("0")
            except OSError:
                pass
            try:
                directory.rmdir()
                return
            except OSError:
                pass
        if time.monotonic() > deadline:
            print(f"warning: cannot remove cgroup {directory}")
            return
        time.sleep(0.01)


def _remove_cgroups(name: str) -> None:
    """Removes the cgroup ``name`` (and the sandboxes' under it) from every hierarchy."""
    base = Path("/sys/fs/cgroup")
    if not base.is_dir():
        return
    hierarchies = [base, *(p for p in base.iterdir() if p.is_dir() and not p.is_symlink())]
    for hierarchy in hierarchies:
        root = hierarchy / name
        if (root / "cgroup.procs").exists():
            _remove_cgroup_tree(root)


def _cleanup(directory: Path, cgroup: str) -> None:
    _unmount_under(directory)
    _remove_cgroups(cgroup)
    shutil.rmtree(directory, ignore_errors=True)


def _free_port() -> int:
    with socketlib.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(socket: Path) -> bool:
    try:
        with sandtree.Sandtree(socket, timeout=2) as client:
            client.info()
        return True
    except sandtree.SandtreeError:
        return False


def _listens(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socketlib.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def start_daemon(directory: Path, cgroup: str) -> Daemon:
    """Starts the daemon on ``directory`` (made if missing, kept if there:
    a restart) and waits until it answers on its socket and its E2B door."""
    binary = _binary()
    directory.mkdir(parents=True, exist_ok=True)
    socket = directory / "sandtree.sock"
    tcp = f"127.0.0.1:{_free_port()}"
    e2b_port = _free_port()
    while f"127.0.0.1:{e2b_port}" == tcp:
        e2b_port = _free_port()
    e2b = f"127.0.0.1:{e2b_port}"
    with open(directory / "daemon.log", "ab") as log:
        process = subprocess.Popen(
            [
                str(binary),
                "daemon",
                "--data-dir",
                str(directory),
                "--socket",
                str(socket),
                "--cgroup-name",
                cgroup,
                "--image-size",
                "4G",
                "--tcp",
                tcp,
                "--e2b",
                e2b,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
    d = Daemon(binary, directory, socket, f"http://{tcp}", cgroup, process, f"http://{e2b}")
    deadline = time.monotonic() + START_TIMEOUT
    while not (socket.exists() and _answers(socket) and _listens(e2b)):
        if process.poll() is not None:
            pytest.fail(f"the daemon exited early ({process.returncode}):\n{d.log()}")
        if time.monotonic() > deadline:
            process.kill()
            process.wait()
            pytest.fail(f"the daemon did not answer within {START_TIMEOUT} s:\n{d.log()}")
        time.sleep(0.05)
    return d


def stop_daemon(d: Daemon, sig: signal.Signals = signal.SIGTERM) -> None:
    """Stops it (SIGTERM, SIGKILL after a while; or ``sig``); its data stays."""
    d.process.send_signal(sig)
    try:
        d.process.wait(STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        d.process.kill()
        d.process.wait()


def checked_environment() -> None:
    if os.geteuid() != 0:
        pytest.skip("the SDK tests run a real sandtree daemon, which needs root: run pytest as root")
    if "btrfs" not in Path("/proc/filesystems").read_text():
        pytest.skip("the kernel has no btrfs, which the sandtree daemon needs")


@pytest.fixture(scope="session")
def daemon() -> Iterator[Daemon]:
    """A daemon of its own for the test session."""
    checked_environment()
    directory = Path(f"/var/tmp/sandtree-pytest-{os.getpid()}")
    cgroup = f"sandtree-pytest-{os.getpid()}"
    _cleanup(directory, cgroup)
    d = None
    try:
        d = start_daemon(directory, cgroup)
        yield d
    finally:
        if d is not None:
            stop_daemon(d)
        _cleanup(directory, cgroup)


@pytest.fixture
def own_daemon() -> Iterator[Callable[[], Daemon]]:
    """Starts a second daemon, on a data directory of its own, each time it
    is called (a restart: the same directory); the last one is stopped and
    everything removed at the end of the test."""
    checked_environment()
    directory = Path(f"/var/tmp/sandtree-pytest-{os.getpid()}-own")
    cgroup = f"sandtree-pytest-{os.getpid()}-own"
    _cleanup(directory, cgroup)
    started: list[Daemon] = []

    def start() -> Daemon:
        started.append(start_daemon(directory, cgroup))
        return started[-1]

    try:
        yield start
    finally:
        for d in started:
            if d.process.poll() is None:
                stop_daemon(d)
        _cleanup(directory, cgroup)


@pytest.fixture(scope="session")
def socket_path(daemon: Daemon) -> str:
    return str(daemon.socket)


@pytest.fixture
def client(socket_path: str) -> Iterator[sandtree.Sandtree]:
    with sandtree.Sandtree(socket_path) as c:
        yield c


@pytest.fixture
def sandbox(client: sandtree.Sandtree) -> Iterator[sandtree.Sandbox]:
    """A fresh sandbox, deleted (with its checkpoints) after the test."""
    with client.create(labels={"test": "pytest"}) as sb:
        yield sb


# A server in a sandbox that counts the connections it answered (in its
# memory): whether a rollback brought the process back as it was.
COUNTER_SERVER = """
import socket
hits = 0
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 7000))
server.listen()
print("ready", flush=True)
while True:
    conn, _ = server.accept()
    hits += 1
    conn.sendall(str(hits).encode())
    conn.close()
"""


def start_counter(sb: sandtree.Sandbox) -> sandtree.Process:
    """Starts the counter in `sb` and waits until it listens."""
    server = sb.spawn(["python3", "-c", COUNTER_SERVER])
    deadline = time.monotonic() + 10
    while b"ready" not in server.output().stdout:
        assert time.monotonic() < deadline, "the counter server did not start"
        time.sleep(0.05)
    return server
