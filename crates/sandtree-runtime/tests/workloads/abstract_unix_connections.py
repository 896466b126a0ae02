# abstract_unix_connections: unix listeners bound in the abstract namespace
# (`@sandtree-stream`, stream; `@sandtree-seq`, seqpacket: as Xvfb's
# `@/tmp/.X11-unix/X0`), each with a connection from this process, data
# queued both ways (issue 38, item 6: such connections were refused).
# Commands: `state` -> each connection's addresses and peer credentials:
# `s=<name>><peer> q=... creds=<pid ok>`; `drain` -> what is queued on each
# end, then a message each way and a new connection accepted:
# `s=<to server>/<to client> q=... echo=<...> new=<ok> pending=<...>`;
# `late` -> a client connects and is not accepted; `close` -> the clients'
# ends closed.
import errno

SERVERS = {}
CLIENTS = {}
ACCEPTED = {}
for key, kind, name in (('s', socket.SOCK_STREAM, '\0sandtree-stream'), ('q', socket.SOCK_SEQPACKET, '\0sandtree-seq')):
    srv = socket.socket(socket.AF_UNIX, kind)
    srv.bind(name)
    srv.listen(8)
    srv.setblocking(False)
    c = socket.socket(socket.AF_UNIX, kind)
    c.connect(name)
    a, _ = srv.accept()
    c.send(b'to-server-' + key.encode())
    a.send(b'to-client-' + key.encode())
    SERVERS[key], CLIENTS[key], ACCEPTED[key] = srv, c, a
late = []


def recv_now(sock):
    try:
        got = sock.recv(100, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return 'none'
    except OSError as e:
        return errno.errorcode[e.errno]
    return got.decode() or 'eof'


def handle(cmd):
    if cmd == 'state':
        out = []
        for key in ('s', 'q'):
            c, a = CLIENTS[key], ACCEPTED[key]
            out.append('%s=%r>%r' % (key, a.getsockname(), c.getpeername()))
        creds = struct.unpack('3i', ACCEPTED['s'].getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        out.append('creds=%s' % ('ok' if creds[0] == os.getpid() else creds[0]))
        return ' '.join(out)
    if cmd == 'drain':
        out = []
        for key in ('s', 'q'):
            c, a = CLIENTS[key], ACCEPTED[key]
            out.append('%s=%s/%s' % (key, recv_now(a), recv_now(c)))
        try:
            CLIENTS['s'].send(b'ping')
            echo = recv_now(ACCEPTED['s'])
        except OSError as e:
            echo = errno.errorcode[e.errno]
        try:
            pending, _ = SERVERS['s'].accept()
            pending.close()
            out.append('pending=yes')
        except BlockingIOError:
            out.append('pending=none')
        n = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        n.connect('\0sandtree-stream')
        m, _ = SERVERS['s'].accept()
        n.send(b'x')
        new = 'ok' if m.recv(1) == b'x' else 'no'
        n.close()
        m.close()
        return ' '.join(out + ['echo=%s' % echo, 'new=%s' % new])
    if cmd == 'late':
        n = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        n.connect('\0sandtree-stream')
        late.append(n)
        return 'connected'
    if cmd == 'close':
        for c in CLIENTS.values():
            c.close()
        return 'closed'
    raise ValueError(cmd)


serve(handle)
