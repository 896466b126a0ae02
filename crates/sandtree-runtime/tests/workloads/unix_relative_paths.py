# unix_relative_paths: a unix listener and a datagram socket bound to
# relative paths (`listen.sock`, `dgram.sock`) from /root/rel, the
# process's working directory (issue 38, item 6: refused before). A
# restore binds them again from there at the same relative names: what
# `getsockname` and a client's `getpeername` give stays `listen.sock`.
# Commands: `state` -> `listener=<its name> dgram=<its name> cwd=<cwd>`;
# A client connected through the listener stays connected (its peer name,
# and the accepted end's own, `listen.sock`): `kept` -> a byte through it.
# `roundtrip` -> a fresh client connects to /root/rel/listen.sock and
# sends `ping`, a fresh socket sends `hello` to /root/rel/dgram.sock:
# `stream=ping peer=<the client's peer name> dgram=hello`; `away` / `back`
# -> chdir to / and back (away, the socket files are not found from the
# working directory: a checkpoint is refused).

os.makedirs('/root/rel', exist_ok=True)
os.chdir('/root/rel')
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind('listen.sock')
listener.listen(4)
dgram = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
dgram.bind('dgram.sock')
# A connection through the listener, kept open.
kept = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
kept.connect('/root/rel/listen.sock')
kept_server, _ = listener.accept()


def handle(cmd):
    if cmd == 'state':
        return 'listener=%s dgram=%s cwd=%s kept=%s,%s' % (
            listener.getsockname(), dgram.getsockname(), os.getcwd(), kept.getpeername(), kept_server.getsockname())
    if cmd == 'kept':
        kept.sendall(b'k')
        return 'kept=%s' % kept_server.recv(16).decode()
    if cmd == 'roundtrip':
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            client.connect('/root/rel/listen.sock')
        except OSError as e:
            return 'connect=errno%d' % e.errno
        client.sendall(b'ping')
        conn, _ = listener.accept()
        got = conn.recv(16).decode()
        peer = client.getpeername()
        conn.close()
        client.close()
        other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            other.sendto(b'hello', '/root/rel/dgram.sock')
        except OSError as e:
            return 'stream=%s peer=%s send=errno%d' % (got, peer, e.errno)
        finally:
            other.close()
        return 'stream=%s peer=%s dgram=%s' % (got, peer, dgram.recv(16).decode())
    if cmd == 'away':
        os.chdir('/')
        return 'cwd=/'
    if cmd == 'back':
        os.chdir('/root/rel')
        return 'cwd=/root/rel'
    raise ValueError(cmd)


serve(handle)
