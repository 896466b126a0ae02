# Prelude of every Python workload: the harness runs `python3 -c <this file,
# then the program> [args]` in the sandbox (the test's files are not visible
# there). `serve(handle, extra, idle)` answers one command per connection on
# 127.0.0.1:7000 (`ping` -> `pong`, any other -> `handle(cmd)`, an exception
# -> `error ...`) and closes the connection before taking the next one;
# `extra` maps more listening sockets to their accept callbacks; `idle`, when
# given, runs between non-blocking polls (otherwise the loop blocks in
# `select`). `avail(fd)`: bytes waiting on a pipe or FIFO; `drain_fd(fd)`:
# what a non-blocking `fd` holds; `status(key)`: a field of /proc/self/status;
# `waited(fd, events)`: whether `poll` reported any of `events` within 3 s;
# `messages_with_fds(sock)`: every message queued on unix socket `sock`,
# each with the descriptors it carried (`SCM_RIGHTS`).
import errno, fcntl, os, select, signal, socket, struct, sys, termios, time

def _readline(c):
    buf = b''
    while not buf.endswith(b'\n'):
        d = c.recv(4096)
        if not d:
            break
        buf += d
    return buf.decode().strip()

def _answer(c, handle):
    try:
        c.settimeout(5)
        cmd = _readline(c)
        if cmd == 'ping':
            out = 'pong'
        else:
            try:
                out = str(handle(cmd))
            except Exception as ex:
                out = 'error %s: %r' % (cmd, ex)
        c.sendall(out.encode() + b'\n')
    except OSError:
        pass
    finally:
        c.close()

def serve(handle, extra=(), idle=None):
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(('127.0.0.1', 7000))
    srv.listen(16)
    others = dict(extra)
    while True:
        if idle is not None:
            idle()
        ready = select.select([srv] + list(others), [], [], 0 if idle is not None else None)[0]
        for s in ready:
            if s is srv:
                c, _ = srv.accept()
                _answer(c, handle)
            else:
                others[s](s)

def waited(fd, what):
    """Whether `poll` of `fd` reported any of `what` within 3 s."""
    p = select.poll()
    p.register(fd, 0)
    deadline = time.time() + 3
    while time.time() < deadline:
        if any(ev & what for _, ev in p.poll(100)):
            return True
    return False

def avail(fd):
    """Bytes waiting to be read on pipe or FIFO `fd`."""
    return struct.unpack('i', fcntl.ioctl(fd, termios.FIONREAD, b'\0\0\0\0'))[0]

def drain_fd(fd):
    """Read what non-blocking `fd` holds."""
    got = b''
    while True:
        try:
            d = os.read(fd, 4096)
        except BlockingIOError:
            break
        if not d:
            break
        got += d
    return got

def proc_stat(pid):
    """The fields of /proc/PID/stat after the name: state, ppid, pgrp,
    session, tty_nr, ... (proc(5) field 3 on, as strings)."""
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rsplit(')', 1)[1].split()


def status(key):
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith(key + ':'):
                return line.split()[1]


def messages_with_fds(sock):
    """Every message queued on `sock` (not waiting), as (text, [fds])."""
    import array
    out = []
    while True:
        try:
            data, anc, _, _ = sock.recvmsg(4096, socket.CMSG_LEN(16 * 4), socket.MSG_DONTWAIT)
        except BlockingIOError:
            return out
        fds = array.array('i')
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(raw[:len(raw) - len(raw) % 4])
        if not data and not fds:
            return out
        out.append((data.decode(), list(fds)))
