# fifo_on_layer: a FIFO /root/ctl on the sandbox's layer, open for reading
# (non-blocking) and for writing, holding `queued`; an epoll watching the
# read end.
# Commands: `state` -> `avail=<bytes waiting> writer_blocking= at_path=<both
# ends are the inode at the path>`; `drain` -> `got=<bytes read>`; `ready` ->
# `ready=<the epoll reports the read end>`; `mutate` -> drains it and writes
# `mutated!!`: `avail=`.
os.mkfifo('/root/ctl')
r = os.open('/root/ctl', os.O_RDONLY | os.O_NONBLOCK)
w = os.open('/root/ctl', os.O_WRONLY)
os.write(w, b'queued')
ep = select.epoll()
ep.register(r, select.EPOLLIN)

def handle(cmd):
    if cmd == 'state':
        blocking = fcntl.fcntl(w, fcntl.F_GETFL) & os.O_NONBLOCK == 0
        at_path = os.fstat(r).st_ino == os.stat('/root/ctl').st_ino == os.fstat(w).st_ino
        return 'avail=%d writer_blocking=%s at_path=%s' % (avail(r), blocking, at_path)
    if cmd == 'drain':
        return 'got=%r' % drain_fd(r)
    if cmd == 'ready':
        return 'ready=%s' % any(fd == r and ev & select.EPOLLIN for fd, ev in ep.poll(0))
    if cmd == 'mutate':
        drain_fd(r)
        os.write(w, b'mutated!!')
        return 'avail=%d' % avail(r)
    raise ValueError(cmd)

serve(handle)
