# file_offset: /root/data open read-write (12 bytes written) and read-only
# (6 bytes read), /root/log open for appending (3 bytes written).
# Commands: `state` -> the three offsets, the O_APPEND flag, the data read
# through the descriptor and afresh, the log, and whether each descriptor is
# still the file at its path; `mutate` -> a write, a read and an append,
# then as `state`.
rw = os.open('/root/data', os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(rw, b'line1\nline2\n')
ro = os.open('/root/data', os.O_RDONLY)
os.read(ro, 6)
ap = os.open('/root/log', os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
os.write(ap, b'a1\n')

def state():
    with open('/root/data', 'rb') as f:
        fresh = f.read()
    with open('/root/log', 'rb') as f:
        log = f.read()
    same = all(os.fstat(fd).st_ino == os.stat(p).st_ino for fd, p in ((rw, '/root/data'), (ro, '/root/data'), (ap, '/root/log')))
    return 'rw=%d ro=%d ap=%d append=%d data=%r fresh=%r log=%r same=%s' % (
        os.lseek(rw, 0, os.SEEK_CUR), os.lseek(ro, 0, os.SEEK_CUR), os.lseek(ap, 0, os.SEEK_CUR),
        bool(fcntl.fcntl(ap, fcntl.F_GETFL) & os.O_APPEND), os.pread(rw, 4096, 0), fresh, log, same)

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        os.write(rw, b'line3\n')
        os.read(ro, 6)
        os.write(ap, b'a2\n')
        return state()
    raise ValueError(cmd)

serve(handle)
