# fifo_on_dev: a FIFO on /dev, a mount a rollback keeps (its inode lives
# on). Who holds its ends shows, and a checkpoint must not change it
# (issue 36, class 1: the templates held its ends). FIFO 1 holds 6 bytes:
# closing its writer makes its reader see the end of file after them.
# FIFO 2: closing its reader makes its writer see the FIFO broken.
# Commands: `state` -> the flags of each end, the bytes FIFO 1 holds,
# whether the ends are the inodes at the paths; `close` -> closes FIFO 1's
# writer and FIFO 2's reader, then waits (at most 3 s) for the end of file
# and the broken FIFO: `read=eof write=broken got=...` when both came.

paths = ('/dev/sandtree-fifo1', '/dev/sandtree-fifo2')
for p in paths:
    if os.path.exists(p):
        os.unlink(p)
    os.mkfifo(p, 0o640)
r1 = os.open(paths[0], os.O_RDONLY | os.O_NONBLOCK)
w1 = os.open(paths[0], os.O_WRONLY)
r2 = os.open(paths[1], os.O_RDONLY | os.O_NONBLOCK)
w2 = os.open(paths[1], os.O_WRONLY | os.O_NONBLOCK)
os.write(w1, b'queued')


def flags(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    mode = {os.O_RDONLY: 'r', os.O_WRONLY: 'w', os.O_RDWR: 'rw'}[fl & os.O_ACCMODE]
    return mode + ('+nb' if fl & os.O_NONBLOCK else '')


def handle(cmd):
    if cmd == 'state':
        at_path = all(os.fstat(fd).st_ino == os.stat(paths[i // 2]).st_ino for i, fd in enumerate((r1, w1, r2, w2)))
        ends = ','.join(flags(fd) for fd in (r1, w1, r2, w2))
        return 'ends=%s avail=%d at_path=%s' % (ends, avail(r1), at_path)
    if cmd == 'close':
        os.close(w1)
        os.close(r2)
        got = b''
        read = 'open'
        if waited(r1, select.POLLHUP):
            got = os.read(r1, 100)
            read = 'eof' if os.read(r1, 100) == b'' else 'open'
        write = 'broken' if waited(w2, select.POLLERR) else 'open'
        return 'read=%s write=%s got=%r' % (read, write, got)
    raise ValueError(cmd)


serve(handle)
