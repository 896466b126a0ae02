# unix_datagram_bound_to_a_path: a unix datagram socket bound to
# /root/dgram.sock (mode 0660), receiving what others send to that path
# (issue 36, class 4: after a rollback the path was a dead copy of the old
# tree's socket file, and a send to it was refused).
# A second one, bound to /root/dgram2.sock, has a client connected to it
# (connect()): it stays the one the client reaches.
# Commands: `state` -> `mode=<file mode> name=<its bound name>
# nonblocking=<flag>`; `roundtrip` -> sends `hello` to the path from a
# fresh socket, then reads it on the bound one: `got=hello`; `client` ->
# the client sends `hi`, the second one reads it: `client=hi`.

sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.bind('/root/dgram.sock')
os.chmod('/root/dgram.sock', 0o660)
sock.setblocking(False)
second = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
second.bind('/root/dgram2.sock')
second.setblocking(False)
client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
client.connect('/root/dgram2.sock')


def handle(cmd):
    if cmd == 'state':
        mode = oct(os.stat('/root/dgram.sock').st_mode & 0o777)
        return 'mode=%s name=%s nonblocking=%s' % (mode, sock.getsockname(), not sock.getblocking())
    if cmd == 'roundtrip':
        other = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            other.sendto(b'hello', '/root/dgram.sock')
        except OSError as e:
            return 'send=errno%d' % e.errno
        finally:
            other.close()
        select.select([sock], [], [], 2)
        try:
            return 'got=%s' % sock.recv(64).decode()
        except BlockingIOError:
            return 'got=nothing'
    if cmd == 'client':
        try:
            client.send(b'hi')
        except OSError as e:
            return 'client=errno%d' % e.errno
        select.select([second], [], [], 2)
        try:
            return 'client=%s' % second.recv(64).decode()
        except BlockingIOError:
            return 'client=nothing'
    raise ValueError(cmd)


serve(handle)
