# pipe_ends_closed_after_a_checkpoint: who holds a pipe's ends shows, and a
# checkpoint must not change it (issue 36, class 1). Pipe 1: closing its
# write ends (one of them a dup) makes its reader see the end of file.
# Pipe 2: closing its read end makes its writer see the pipe broken. Pipe
# 3: a packet-mode (O_DIRECT) pipe holding two messages.
# Commands: `state` -> the flags of each end, whether the pair's inode is
# shared, what pipe 3 holds (peeked by its size); `close` -> closes pipe 1's
# writers and pipe 2's reader, then waits (at most 3 s) for the end of file
# and the broken pipe: `read=eof write=broken` when both came.

r1, w1 = os.pipe()
w1b = os.dup(w1)
os.set_blocking(r1, False)
r2, w2 = os.pipe()
os.set_blocking(w2, False)
r3, w3 = os.pipe2(os.O_DIRECT | os.O_NONBLOCK)
os.write(w3, b'one')
os.write(w3, b'two!')


def flags(fd):
    fl = fcntl.fcntl(fd, fcntl.F_GETFL)
    names = [n for n, bit in (('nb', os.O_NONBLOCK), ('direct', os.O_DIRECT)) if fl & bit]
    mode = {os.O_RDONLY: 'r', os.O_WRONLY: 'w', os.O_RDWR: 'rw'}[fl & os.O_ACCMODE]
    return mode + ''.join('+' + n for n in names)


def ends():
    return ','.join(flags(fd) for fd in (r1, w1, w1b, r2, w2, r3, w3))


def handle(cmd):
    if cmd == 'state':
        same = os.fstat(r1).st_ino == os.fstat(w1).st_ino and os.fstat(r1).st_ino != os.fstat(r2).st_ino
        return 'ends=%s pair=%s pipe3=%d' % (ends(), 'same' if same else 'split', avail(r3))
    if cmd == 'close':
        os.close(w1)
        os.close(w1b)
        os.close(r2)
        read = 'eof' if waited(r1, select.POLLHUP) and os.read(r1, 10) == b'' else 'open'
        write = 'broken' if waited(w2, select.POLLERR) else 'open'
        return 'read=%s write=%s' % (read, write)
    if cmd == 'messages':
        return 'got=%r,%r' % (os.read(r3, 100), os.read(r3, 100))
    raise ValueError(cmd)


serve(handle)
