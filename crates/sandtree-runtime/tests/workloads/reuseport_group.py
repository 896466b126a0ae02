# State: a SO_REUSEPORT group: two TCP listeners of this process on
# 127.0.0.1:7020, and two UDP sockets on 127.0.0.1:7021, each bound with
# SO_REUSEPORT.
# Commands:
# - `state`: each socket's address and SO_REUSEPORT;
# - `mutate`: closes the second of each;
# - `spread`: 40 connections to 7020 and 40 datagrams to 7021 from new
#   sockets (new source ports: the kernel spreads them by hash over the
#   group): which of the group took some (`tcp=both udp=both` when every
#   member is in the group again).

import select


def make(kind):
    s = socket.socket(socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    s.bind(('127.0.0.1', 7020 if kind == socket.SOCK_STREAM else 7021))
    if kind == socket.SOCK_STREAM:
        s.listen(64)
    s.setblocking(False)
    return s


tcp = [make(socket.SOCK_STREAM), make(socket.SOCK_STREAM)]
udp = [make(socket.SOCK_DGRAM), make(socket.SOCK_DGRAM)]


def handle(cmd):
    if cmd == 'state':
        return ' '.join('%s:%d,%d' % (s.getsockname()[0], s.getsockname()[1],
                                      s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)) for s in tcp + udp)
    if cmd == 'mutate':
        tcp[1].close()
        udp[1].close()
        return 'closed'
    if cmd == 'spread':
        clients = [socket.create_connection(('127.0.0.1', 7020)) for _ in range(40)]
        for i in range(40):
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            u.sendto(b'%d' % i, ('127.0.0.1', 7021))
            u.close()
        time.sleep(0.1)
        took = []
        for group in (tcp, udp):
            n = 0
            for s in group:
                got = False
                while True:
                    try:
                        if s.type == socket.SOCK_STREAM:
                            c, _ = s.accept()
                            c.close()
                        else:
                            s.recv(16)
                        got = True
                    except (BlockingIOError, OSError):
                        break
                n += got
            took.append('both' if n == 2 else str(n))
        for c in clients:
            c.close()
        return 'tcp=%s udp=%s' % tuple(took)
    return 'unknown'


serve(handle)
