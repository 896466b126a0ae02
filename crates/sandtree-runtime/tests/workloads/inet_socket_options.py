# State: inet sockets with a protocol and options of their own, which a
# restore makes anew: a TCP listener (TCP_NODELAY, SO_KEEPALIVE,
# TCP_KEEPIDLE, IP_TTL, IP_TOS), a bound UDP-Lite socket with a checksum
# coverage, and a UDP socket bound with IP_FREEBIND to an address that no
# interface has.
# Commands: `opts` reports each socket's protocol, options and address
# (as getsockopt and getsockname give them); `change` changes the options;
# `reach` connects to the TCP listener and sends a datagram to the UDP-Lite
# socket: `tcp=ok lite=ok`; `queue` leaves a datagram queued on the
# UDP-Lite socket (a checkpoint must refuse it: only UDP's datagrams are
# captured), `unqueue` reads it.

IPPROTO_UDPLITE = 136
UDPLITE_SEND_CSCOV = 10
UDPLITE_RECV_CSCOV = 11
IP_FREEBIND = 15

tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
# (SO_REUSEADDR, as servers set it: without, the restore's bind of the
# listener fails while connections it served are in TIME_WAIT.)
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
tcp.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77)
tcp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 33)
tcp.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, 0x10)
tcp.bind(('127.0.0.1', 7001))
tcp.listen(4)

lite = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, IPPROTO_UDPLITE)
lite.setsockopt(IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV, 20)
lite.setsockopt(IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV, 20)
lite.bind(('127.0.0.1', 7002))

free = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
free.setsockopt(socket.IPPROTO_IP, IP_FREEBIND, 1)
free.bind(('10.253.0.7', 7003))


def opt(s, level, name):
    return s.getsockopt(level, name)


def handle(cmd):
    if cmd == 'opts':
        return ' '.join([
            'tcp=%d,%d,%d,%d,%d,%d' % (
                opt(tcp, socket.SOL_SOCKET, socket.SO_PROTOCOL),
                opt(tcp, socket.IPPROTO_TCP, socket.TCP_NODELAY),
                opt(tcp, socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                opt(tcp, socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                opt(tcp, socket.IPPROTO_IP, socket.IP_TTL),
                opt(tcp, socket.IPPROTO_IP, socket.IP_TOS)),
            'lite=%d,%d,%d' % (
                opt(lite, socket.SOL_SOCKET, socket.SO_PROTOCOL),
                opt(lite, IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV),
                opt(lite, IPPROTO_UDPLITE, UDPLITE_RECV_CSCOV)),
            'free=%d,%d,%s:%d' % ((
                opt(free, socket.SOL_SOCKET, socket.SO_PROTOCOL),
                opt(free, socket.IPPROTO_IP, IP_FREEBIND)) + free.getsockname()),
        ])
    if cmd == 'change':
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
        tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 99)
        tcp.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 44)
        lite.setsockopt(IPPROTO_UDPLITE, UDPLITE_SEND_CSCOV, 30)
        return handle('opts')
    if cmd == 'reach':
        c = socket.create_connection(('127.0.0.1', 7001), timeout=2)
        peer, _ = tcp.accept()
        peer.close()
        c.close()
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, IPPROTO_UDPLITE)
        s.sendto(b'x', ('127.0.0.1', 7002))
        s.close()
        lite.settimeout(2)
        got = lite.recv(16)
        return 'tcp=ok lite=%s' % ('ok' if got == b'x' else repr(got))
    if cmd == 'queue':
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM, IPPROTO_UDPLITE)
        s.sendto(b'q', ('127.0.0.1', 7002))
        s.close()
        return 'queued'
    if cmd == 'unqueue':
        lite.settimeout(2)
        return 'read=%s' % lite.recv(16).decode()
    return 'unknown'


serve(handle)
