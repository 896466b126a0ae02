# descriptors_in_flight_between_processes: a child sends files to its
# parent on a unix stream pair and closes them: in flight only, the
# parent has not received them (issue 38, item 6). The child's part:
# - a TCP listener on 127.0.0.1:7101 (no process holds it);
# - a pipe's write end (the child keeps the read end: it answers each
#   line it reads there with `echo:<line>` on the pair, and ` ev=<n>`
#   when it found an eventfd the parent sent it on the pair).
# And the parent sends its child an eventfd (counter 7) on the pair, in
# flight too: the child is a child of another process (made again by its
# parent at a restore).
# Commands: `fill` -> the child sends them: `sent`; `state` -> `ready`;
# `drain` -> each message received and its file used (a connection
# accepted on the listener, a line through the pipe):
# `<msg>[<files>]=<use>,...` (`none`).
import array

here, there = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
go_r, go_w = os.pipe()
child = os.fork()
if child == 0:
    here.close()
    os.close(go_w)
    r = None
    while True:
        cmd = os.read(go_r, 16)
        if cmd == b'fill':
            lst = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lst.bind(('127.0.0.1', 7101))
            lst.listen(4)
            socket.send_fds(there, [b'listener'], [lst.fileno()])
            lst.close()
            r, w = os.pipe()
            socket.send_fds(there, [b'pipe'], [w])
            os.close(w)
            break
    os.close(go_r)
    while True:
        line = os.read(r, 100)
        if not line:
            os._exit(0)
        try:
            _, anc, _, _ = there.recvmsg(16, socket.CMSG_LEN(4), socket.MSG_DONTWAIT)
            ev = array.array('i', anc[0][2][:4])[0]
            line += b' ev=%d' % os.eventfd_read(ev)
            os.close(ev)
        except (BlockingIOError, IndexError):
            pass
        there.send(b'echo:' + line)
there.close()
os.close(go_r)


def use(msg, fds):
    if msg == 'listener':
        lst = socket.socket(fileno=fds[0])
        c = socket.create_connection(('127.0.0.1', 7101), timeout=3)
        lst.settimeout(3)
        a, _ = lst.accept()
        a.close()
        c.close()
        lst.close()
        return 'accepted'
    if msg == 'pipe':
        os.write(fds[0], b'x')
        os.close(fds[0])
        here.settimeout(3)
        got = here.recv(100).decode()
        here.setblocking(True)
        return got
    return '?'


def handle(cmd):
    if cmd == 'fill':
        os.write(go_w, b'fill')
        # (Until both are queued.)
        deadline = time.time() + 3
        while time.time() < deadline:
            n = struct.unpack('i', fcntl.ioctl(here, termios.FIONREAD, b'\0' * 4))[0]
            if n >= len('listenerpipe'):
                ev = os.eventfd(7)
                socket.send_fds(here, [b'ev'], [ev])
                os.close(ev)
                return 'sent'
            time.sleep(0.01)
        return 'not sent'
    if cmd == 'state':
        return 'ready'
    if cmd == 'drain':
        got = []
        for msg, fds in messages_with_fds(here):
            got.append('%s[%d]=%s' % (msg, len(fds), use(msg, fds) if fds else ''))
        return ','.join(got) or 'none'
    raise ValueError(cmd)


serve(handle)
