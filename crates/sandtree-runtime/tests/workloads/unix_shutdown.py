# State: unix socket pairs: a stream pair with one end shut down for
# writing (the other end reads the end of the stream, the shut-down end's
# sends fail with EPIPE), and a seqpacket pair with two messages queued.
# Commands: `state` reports, without consuming anything, what each
# receiving end holds (peeked) and whether it sees the end of the stream,
# and what a send from the shut-down end gives (its errno).

a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
a.shutdown(socket.SHUT_WR)
c, d = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
c.send(b'one')
c.send(b'two')
b.setblocking(False)
d.setblocking(False)


def peek(s):
    try:
        got = s.recv(64, socket.MSG_PEEK)
        return 'eof' if got == b'' else got.decode()
    except BlockingIOError:
        return 'empty'


def send_err(s):
    try:
        s.send(b'x', socket.MSG_DONTWAIT)
        return 'sent'
    except OSError as e:
        return 'errno%d' % e.errno


def handle(cmd):
    if cmd == 'state':
        return 'stream=%s send=%s seqpacket=%s' % (peek(b), send_err(a), peek(d))
    if cmd == 'drain':
        b.recv(64)
        return 'stream=%s after=%s' % ('read', peek(b))
    return 'unknown'


serve(handle)
