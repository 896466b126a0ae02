# descriptors_in_flight: files sent on unix sockets with SCM_RIGHTS and not
# received yet (issue 38, item 6: refused before), one process:
# - on a datagram pair: a pipe's read end (in flight only: its write end is
#   kept), a file opened at offset 3 (in flight only), a message without,
#   an epoll watching a kept eventfd (ready), a memfd holding
#   `memfd-data` (overwritten by the drain),
#   both ends of a pipe holding `zz` (the pipe is in flight only);
# - on a stream pair: `head`, then `fd` with a dup of a file the program
#   keeps open (one offset for both), then `tail`;
# - on a seqpacket pair: an end of another pair, whose peer is kept and
#   wrote to it (data queued on a socket in flight);
# - on a connection through a listener bound to /root/l.sock: an eventfd
#   (counter 5);
# - on a datagram socket bound to /root/inbox.sock, not connected: both
#   ends of a pipe holding `dg` from a socket bound to /root/snd.sock, an
#   eventfd (counter 9) from an unbound one.
# Commands: `fill` -> all sent: `sent`; `state` -> `ready`; `drain` ->
# every message received and each file used:
# `d:<msg>[<files>]=<use>,... s:... q:... c:...`; `late` -> one more
# message with a file on each socket; `deleted` -> a deleted file sent on
# the datagram pair (a checkpoint refuses it); `empty` -> a file sent on the
# datagram pair with no bytes (refused: a peek marks an empty message);
# `light` -> `fill`'s file alone,
# the descriptor table as it was.
import array

os.chdir('/root')
with open('/root/f.txt', 'w') as f:
    f.write('0123456789')
d0, d1 = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
s0, s1 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
q0, q1 = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
lst = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
lst.bind('/root/l.sock')
lst.listen()
c0 = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
c0.connect('/root/l.sock')
c1, _ = lst.accept()
kept = os.open('/root/f.txt', os.O_RDONLY)
inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
inbox.bind('/root/inbox.sock')
snd = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
snd.bind('/root/snd.sock')
anon = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
ready = os.eventfd(1)
w = e1 = None


def use(msg, fds):
    if msg == 'pipe':
        os.write(w, b'hello')
        return os.read(fds[0], 100).decode()
    if msg == 'both':
        os.write(fds[1], b'Q')
        return os.read(fds[0], 100).decode()
    if msg == 'memfd':
        got = os.pread(fds[0], 100, 0).decode()
        os.pwrite(fds[0], b'CHANGED', 0)
        return got
    if msg == 'file':
        return os.read(fds[0], 3).decode()
    if msg.startswith('head'):
        got = os.read(fds[0], 2).decode()
        return '%s/%d' % (got, os.lseek(kept, 0, os.SEEK_CUR))
    if msg == 'sock':
        e0 = socket.socket(fileno=fds[0])
        got = e0.recv(100).decode()
        e0.send(b'pong')
        return '%s/%s' % (got, e1.recv(100).decode())
    if msg == 'epoll':
        ep = select.epoll.fromfd(os.dup(fds[0]))
        got = ep.poll(0)
        ep.close()
        return 'ready=%d' % len([1 for fd, ev in got if fd == ready])
    if msg in ('ev', 'anon'):
        return str(os.eventfd_read(fds[0]))
    if msg == 'to-inbox':
        os.write(fds[1], b'X')
        return os.read(fds[0], 100).decode()
    return '?'


def handle(cmd):
    global w, e1
    if cmd == 'fill':
        r, w = os.pipe()
        socket.send_fds(d0, [b'pipe'], [r])
        os.close(r)
        f = os.open('/root/f.txt', os.O_RDONLY)
        os.lseek(f, 3, os.SEEK_SET)
        socket.send_fds(d0, [b'file'], [f])
        os.close(f)
        d0.send(b'plain')
        ep = select.epoll()
        ep.register(ready, select.EPOLLIN)
        socket.send_fds(d0, [b'epoll'], [ep.fileno()])
        ep.close()
        m = os.memfd_create('in-flight')
        os.write(m, b'memfd-data')
        socket.send_fds(d0, [b'memfd'], [m])
        os.close(m)
        r2, w2 = os.pipe()
        os.write(w2, b'zz')
        socket.send_fds(d0, [b'both'], [r2, w2])
        os.close(r2)
        os.close(w2)
        os.lseek(kept, 1, os.SEEK_SET)
        s0.send(b'head')
        socket.send_fds(s0, [b'fd'], [kept])
        s0.send(b'tail')
        e0, e1 = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        e1.send(b'to-e0')
        socket.send_fds(q0, [b'sock'], [e0.fileno()])
        e0.close()
        ev = os.eventfd(5)
        socket.send_fds(c0, [b'ev'], [ev])
        os.close(ev)
        r3, w3 = os.pipe()
        os.write(w3, b'dg')
        snd.sendmsg([b'to-inbox'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [r3, w3]))], 0, '/root/inbox.sock')
        os.close(r3)
        os.close(w3)
        ev = os.eventfd(9)
        anon.sendmsg([b'anon'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [ev]))], 0, '/root/inbox.sock')
        os.close(ev)
        return 'sent'
    if cmd == 'light':
        f = os.open('/root/f.txt', os.O_RDONLY)
        os.lseek(f, 3, os.SEEK_SET)
        socket.send_fds(d0, [b'file'], [f])
        os.close(f)
        return 'sent'
    if cmd == 'state':
        return 'ready'
    if cmd == 'drain':
        out = []
        for name, sock in (('d', d1), ('s', s1), ('q', q1), ('c', c1)):
            got = []
            for msg, fds in messages_with_fds(sock):
                got.append('%s[%d]=%s' % (msg, len(fds), use(msg, fds) if fds else ''))
                for fd in fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
            out.append('%s:%s' % (name, ','.join(got)))
        got = []
        while True:
            try:
                data, anc, _, addr = inbox.recvmsg(4096, socket.CMSG_LEN(16 * 4), socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            fds = array.array('i')
            for level, kind, raw in anc:
                fds.frombytes(raw[:len(raw) - len(raw) % 4])
            msg = data.decode()
            got.append('%s@%s[%d]=%s' % (msg, addr or '', len(fds), use(msg, list(fds)) if fds else ''))
            for fd in fds:
                os.close(fd)
        out.append('u:%s' % ','.join(got))
        return ' '.join(out)
    if cmd == 'late':
        r, w2 = os.pipe()
        for sock in (d0, s0, q0, c0):
            socket.send_fds(sock, [b'late'], [r])
        os.close(r)
        os.close(w2)
        return 'sent'
    if cmd == 'empty':
        f = os.open('/root/f.txt', os.O_RDONLY)
        d0.sendmsg([b''], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', [f]))])
        os.close(f)
        return 'sent'
    if cmd == 'deleted':
        f = os.open('/root/gone.txt', os.O_CREAT | os.O_RDWR)
        os.unlink('/root/gone.txt')
        socket.send_fds(d0, [b'deleted'], [f])
        os.close(f)
        return 'sent'
    raise ValueError(cmd)


serve(handle)
