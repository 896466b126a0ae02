# deleted_fifo: a named pipe /root/ff, open for reading and for writing
# with `ck-bytes` in it, then unlinked (issue 38, item 7: deleted FIFOs
# were refused). Commands: `state` -> `avail=<bytes> link=<its fd's
# link>`; `mutate` -> 5 more bytes written, 3 read, then as `state`;
# `drain` -> what it holds: `got=<bytes>`; `eof` -> the writer closed, a
# read: `eof=<bytes read>` (0: the end, as a pipe's).

os.mkfifo('/root/ff')
r = os.open('/root/ff', os.O_RDONLY | os.O_NONBLOCK)
w = os.open('/root/ff', os.O_WRONLY)
os.write(w, b'ck-bytes')
os.unlink('/root/ff')


def handle(cmd):
    global w
    if cmd == 'state':
        return 'avail=%d link=%s' % (avail(r), os.readlink('/proc/self/fd/%d' % r))
    if cmd == 'mutate':
        os.write(w, b'+late')
        os.read(r, 3)
        return handle('state')
    if cmd == 'drain':
        return 'got=%s' % os.read(r, 100).decode()
    if cmd == 'eof':
        os.close(w)
        got = len(os.read(r, 100))
        w = os.open('/proc/self/fd/%d' % r, os.O_WRONLY)
        return 'eof=%d' % got
    raise ValueError(cmd)


serve(handle)
