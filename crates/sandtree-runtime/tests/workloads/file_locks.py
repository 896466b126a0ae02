# State: locks held on files of the layer: `flock` (exclusive) on
# /root/a; POSIX record locks on /root/b (read on bytes 10-19, write from
# byte 100 to the end and beyond); an OFD lock (write, bytes 0-9) on
# /root/c.
# Commands:
# - `state`: the locks as /proc/self/fdinfo shows them (kind, access,
#   range), and whether another process's attempt to take each, without
#   waiting, fails (`busy`) or succeeds (`free`);
# - `mutate`: releases them all.

F_OFD_SETLK = 37

for name in ('a', 'b', 'c'):
    with open('/root/' + name, 'w') as f:
        f.write('x' * 200)
a = open('/root/a', 'r+')
b = open('/root/b', 'r+')
c = open('/root/c', 'r+')
fcntl.flock(a, fcntl.LOCK_EX)
fcntl.lockf(b, fcntl.LOCK_SH, 10, 10)
fcntl.lockf(b, fcntl.LOCK_EX, 0, 100)
fcntl.fcntl(c, F_OFD_SETLK, struct.pack('hhxxxxqqixxxx', fcntl.F_WRLCK, 0, 0, 10, 0))


def shown(f):
    out = []
    with open('/proc/self/fdinfo/%d' % f.fileno()) as info:
        for line in info:
            if line.startswith('lock:'):
                w = line.split()
                out.append('%s/%s/%s-%s' % (w[2], w[4], w[7], w[8]))
    return '+'.join(out) or 'none'


def tries():
    """Another process's attempts: `busy` where a lock is held."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        res = []
        for path, how in (('/root/a', 'flock'), ('/root/b', 'read100'), ('/root/b', 'write10'), ('/root/c', 'ofd')):
            f = open(path, 'r+')
            try:
                if how == 'flock':
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                elif how == 'read100':
                    fcntl.lockf(f, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, 150)
                elif how == 'write10':
                    fcntl.lockf(f, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 15)
                else:
                    fcntl.fcntl(f, F_OFD_SETLK, struct.pack('hhxxxxqqixxxx', fcntl.F_RDLCK, 0, 5, 1, 0))
                res.append('free')
            except OSError:
                res.append('busy')
        os.write(w, ','.join(res).encode())
        os._exit(0)
    os.close(w)
    got = os.read(r, 100).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return got


def handle(cmd):
    if cmd == 'state':
        return 'a=%s b=%s c=%s others=%s' % (shown(a), shown(b), shown(c), tries())
    if cmd == 'mutate':
        fcntl.flock(a, fcntl.LOCK_UN)
        fcntl.lockf(b, fcntl.LOCK_UN, 0, 0)
        fcntl.fcntl(c, F_OFD_SETLK, struct.pack('hhxxxxqqixxxx', fcntl.F_UNLCK, 0, 0, 10, 0))
        return handle('state')
    return 'unknown'


serve(handle)
