# replies_from_a_gone_child: a child answers on unix socket pairs and
# exits before its parent reads (a `multiprocessing.Pipe()` worker that
# sent its result): the parent's ends hold data from a peer that is gone
# (issue 38, item 6: refused before). On a stream pair the parent then
# reads the end; on a datagram pair, nothing more, and a send is
# refused; on a stream pair whose child left a message of the parent's
# unread, the read after the data fails with ECONNRESET.
# Commands: `fill` -> the child answers and is reaped: `sent`; `state` ->
# `ready`; `drain` -> `s=<reads> d=<reads>,send:<error> r=<reads>`.
import multiprocessing.connection

s_par, s_child = socket.socketpair()
d_par, d_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
r_par, r_child = socket.socketpair()
for sock in (s_par, d_par, r_par):
    sock.setblocking(False)


def reads(sock):
    out = []
    while True:
        try:
            got = sock.recv(100)
        except BlockingIOError:
            return out + ['again']
        except ConnectionResetError:
            return out + ['reset']
        if not got:
            return out + ['eof']
        out.append(got.decode())


def handle(cmd):
    if cmd == 'fill':
        r_par.send(b'unread')
        pid = os.fork()
        if pid == 0:
            s_child.send(b'result')
            d_child.send(b'dgram-result')
            r_child.send(b'late')
            os._exit(0)
        for sock in (s_child, d_child, r_child):
            sock.close()
        os.waitpid(pid, 0)
        return 'sent'
    if cmd == 'state':
        return 'ready'
    if cmd == 'drain':
        d = reads(d_par)
        try:
            d_par.send(b'x')
            sent = 'ok'
        except OSError as e:
            sent = errno.errorcode[e.errno]
        return 's=%s d=%s,send:%s r=%s' % (','.join(reads(s_par)), ','.join(d), sent, ','.join(reads(r_par)))
    raise ValueError(cmd)


serve(handle)
