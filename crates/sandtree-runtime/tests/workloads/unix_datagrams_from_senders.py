# unix_datagrams_from_senders: a unix datagram socket bound to
# /root/inbox.sock, not connected, with datagrams queued from three
# senders (issue 38, item 6: refused before): one bound to /root/a.sock,
# one bound to the relative path b.sock (from /root), one not bound.
# Commands: `fill` -> the four datagrams sent: `sent`; `state` -> `ready`;
# `drain` -> every datagram read with its sender's address:
# `<bytes>@<address>,...` (`none`); `late` -> one more from a; `gone` -> one from a
# socket bound to /root/gone.sock, closed at once (no process holds the
# sender: a checkpoint must refuse it); `connect` -> one from a socket
# connected to the inbox, kept (the inbox is then kept by the template,
# not bound again: refused); `disconnect` -> that socket closed.

os.chdir('/root')
inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
inbox.bind('/root/inbox.sock')
a = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
a.bind('/root/a.sock')
b = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
b.bind('b.sock')
c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)


def handle(cmd):
    if cmd == 'fill':
        a.sendto(b'from-a', '/root/inbox.sock')
        c.sendto(b'anon', '/root/inbox.sock')
        b.sendto(b'from-b', '/root/inbox.sock')
        a.sendto(b'again', '/root/inbox.sock')
        return 'sent'
    if cmd == 'state':
        return 'ready'
    if cmd == 'drain':
        out = []
        while True:
            try:
                data, addr = inbox.recvfrom(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                return ','.join(out) or 'none'
            out.append('%s@%s' % (data.decode(), addr or ''))
    if cmd == 'late':
        a.sendto(b'late', '/root/inbox.sock')
        return 'sent'
    if cmd == 'connect':
        global k
        k = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        k.connect('/root/inbox.sock')
        k.send(b'via-k')
        return 'sent'
    if cmd == 'disconnect':
        k.close()
        return 'closed'
    if cmd == 'gone':
        g = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        g.bind('/root/gone.sock')
        g.sendto(b'bye', '/root/inbox.sock')
        g.close()
        return 'sent'
    raise ValueError(cmd)


serve(handle)
