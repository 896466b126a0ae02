# udp_queued_datagrams: datagrams queued on UDP sockets at the checkpoint
# (issue 38, item 6: refused before on a bound socket; on a connected one
# what came after the checkpoint stayed): an IPv4 socket bound to
# 127.0.0.1:9400 holds two (one of 3000 bytes) from
# 127.0.0.1:9410; a dual-stack IPv6 socket bound to [::]:9401 holds one
# from [::1]:9411 and one from IPv4 127.0.0.1:9410 (seen as
# ::ffff:127.0.0.1); a socket connected to 127.0.0.1:9402 holds two from
# there.
# Commands: `state` -> `ready`; `drain` -> every datagram read, with its
# sender: `v4=<bytes>@<host>:<port>,... v6=... conn=...` (a long one as
# its length); `late` -> one more datagram sent to each.

def sock(family, addr):
    s = socket.socket(family, socket.SOCK_DGRAM)
    s.bind(addr)
    return s

v4 = sock(socket.AF_INET, ('127.0.0.1', 9400))
v6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
v6.bind(('::', 9401))
peer = sock(socket.AF_INET, ('127.0.0.1', 9402))
conn = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
conn.connect(('127.0.0.1', 9402))
a = sock(socket.AF_INET, ('127.0.0.1', 9410))
b = sock(socket.AF_INET6, ('::1', 9411))
a.sendto(b'one', ('127.0.0.1', 9400))
a.sendto(b'x' * 3000, ('127.0.0.1', 9400))
b.sendto(b'six', ('::1', 9401))
a.sendto(b'mapped', ('127.0.0.1', 9401))
peer.sendto(b'c1', conn.getsockname())
peer.sendto(b'c2', conn.getsockname())


def drain(s):
    out = []
    while True:
        try:
            data, addr = s.recvfrom(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return ','.join(out)
        shown = data.decode() if len(data) < 100 else 'len%d' % len(data)
        out.append('%s@%s:%d' % (shown, addr[0], addr[1]))


def handle(cmd):
    if cmd == 'state':
        return 'ready'
    if cmd == 'drain':
        return 'v4=%s v6=%s conn=%s' % (drain(v4), drain(v6), drain(conn))
    if cmd == 'late':
        a.sendto(b'late', ('127.0.0.1', 9400))
        b.sendto(b'late', ('::1', 9401))
        peer.sendto(b'late', conn.getsockname())
        return 'sent'
    raise ValueError(cmd)


serve(handle)
