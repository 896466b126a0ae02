# unix_connection_closed_after_a_checkpoint: connections made through unix
# listeners (`connect` here, `accept` there), to a process this program
# started (forked twice: a child of init and a session leader, as templates
# need) that listens on /root/conn.sock (stream) and /root/seq.sock
# (seqpacket), listeners this program made and holds too. On each
# connection it answers `ping` with `pong`, `cred` with the pid its
# connection's SO_PEERCRED names, `listener` with the inode of its stream
# listener, and closes its end on `bye` (it goes on listening). A
# checkpoint must not keep that end open (issue 36, class 1): this program
# then reads the end of the stream. After a rollback the connections are
# made anew with the same addresses and peer credentials, and both
# listeners take new connections of their type. Children are reaped by
# the kernel (SIGCHLD ignored).
# Commands: `state` -> per connection `<kind>=<answer to ping>,<addresses>,
# <creds>,one_listener=<the stream listener is one socket in both>`;
# `close` -> `bye` on both, then waits (at most 3 s each) for the end of
# the stream: `<kind>=eof` when it came; then connects again; `pending` ->
# connects to /root/idle.sock, a listener of this program's that nobody
# accepts on: `pending`; `unpending` -> closes that: `closed`.

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
KINDS = (('stream', '/root/conn.sock', socket.SOCK_STREAM), ('seqpacket', '/root/seq.sock', socket.SOCK_SEQPACKET))
# (Made here, and held by both processes: one socket each, after a
# rollback too.)
listeners = []
for _, path, ty in KINDS:
    l = socket.socket(socket.AF_UNIX, ty)
    l.bind(path)
    l.listen(4)
    listeners.append(l)
# (One that nobody accepts on: `pending`.)
idle = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
idle.bind('/root/idle.sock')
idle.listen(4)
waiting = None
ready_r, ready_w = os.pipe()
if os.fork() == 0:
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    os.close(ready_r)
    os.write(ready_w, b'%d' % os.getpid())
    os.close(ready_w)
    conns = []
    while True:
        for s in select.select(listeners + conns, [], [])[0]:
            if s in listeners:
                conns.append(s.accept()[0])
                continue
            got = s.recv(64)
            if got in (b'', b'bye'):
                conns.remove(s)
                s.close()
            elif got == b'ping':
                s.sendall(b'pong')
            elif got == b'listener':
                s.sendall(b'%d' % os.fstat(listeners[0].fileno()).st_ino)
            elif got == b'cred':
                pid, _, _ = struct.unpack('3i', s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
                s.sendall(b'%d' % pid)
            else:
                s.sendall(b'what')
os.close(ready_w)
server = int(os.read(ready_r, 64))
os.close(ready_r)


def connect():
    out = {}
    for kind, path, ty in KINDS:
        c = socket.socket(socket.AF_UNIX, ty)
        c.connect(path)
        c.settimeout(3)
        out[kind] = c
    return out


conns = connect()


def describe(kind, c):
    c.sendall(b'ping')
    pong = c.recv(64).decode()
    c.sendall(b'cred')
    theirs = int(c.recv(64))
    mine = struct.unpack('3i', c.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
    # (This program listened: a client's SO_PEERCRED names it.)
    creds = 'creds=ok' if (theirs, mine) == (os.getpid(), os.getpid()) else 'creds=%d,%d' % (theirs, mine)
    c.sendall(b'listener')
    same = int(c.recv(64)) == os.fstat(listeners[0].fileno()).st_ino
    return '%s=%s,peer=%s,name=%r,%s,one_listener=%s' % (kind, pong, c.getpeername(), c.getsockname(), creds, same)


def handle(cmd):
    global conns, waiting
    if cmd == 'pending':
        waiting = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        waiting.connect('/root/idle.sock')
        return 'pending'
    if cmd == 'unpending':
        waiting.close()
        waiting = None
        return 'closed'
    if cmd == 'state':
        return ' '.join(describe(kind, c) for kind, c in conns.items())
    if cmd == 'close':
        out = []
        for kind, c in conns.items():
            c.sendall(b'bye')
            try:
                got = c.recv(64)
            except socket.timeout:
                got = None
            out.append('%s=%s' % (kind, 'eof' if got == b'' else 'open' if got is None else repr(got)))
            c.close()
        conns = connect()
        return ' '.join(out)
    raise ValueError(cmd)


serve(handle)
