# deleted_open_files: an O_TMPFILE file (never had a name) holding
# `tmpfile-ck`, and /root/gone.txt holding `named-ck`, unlinked while open;
# /root/big, unlinked while open, 101 MiB with 24 MiB of data at its start
# and 1 MiB at 100 MiB (a hole between), and a memfd of 20 MiB (issue 38,
# item 7: deleted files of any size, stored sparsely; both were refused
# over 16 MiB).
# Commands: `state` -> `tmp=<contents>@<offset> named=<contents>@<offset>
# big=<hash>:<size>:<MiB allocated> memfd=<hash>:<size>`; `mutate` ->
# appends to the first, overwrites the start of the second, writes into
# the big file's hole and the memfd, then as `state`.
import hashlib, tempfile
tmp = tempfile.TemporaryFile()          # O_TMPFILE: never had a name
tmp.write(b'tmpfile-ck'); tmp.flush()
named = open('/root/gone.txt', 'w+b')
named.write(b'named-ck'); named.flush()
os.unlink('/root/gone.txt')
big = open('/root/big', 'w+b')
big.write(bytes(range(256)) * (24 << 12))
big.seek(100 << 20)
big.write(b'end' * (1 << 18) + b'x' * (1 << 18))
big.flush()
os.unlink('/root/big')
mfd = os.memfd_create('twenty')
os.write(mfd, b'm' * (20 << 20))


def digest(fd):
    h = hashlib.sha1()
    size = os.fstat(fd).st_size
    for off in range(0, size, 1 << 20):
        h.update(os.pread(fd, 1 << 20, off))
    return '%s:%d' % (h.hexdigest()[:12], size)


def big_state():
    return '%s:%d' % (digest(big.fileno()), (os.fstat(big.fileno()).st_blocks * 512) >> 20)

def show(f):
    pos = f.tell()
    f.seek(0)
    data = f.read()
    f.seek(pos)
    return '%s@%d' % (data.decode(), pos)

def handle(cmd):
    if cmd == 'state':
        return 'tmp=%s named=%s big=%s memfd=%s' % (show(tmp), show(named), big_state(), digest(mfd))
    if cmd == 'mutate':
        tmp.write(b'+more'); tmp.flush()
        named.seek(0); named.write(b'NAMED'); named.flush()
        os.pwrite(big.fileno(), b'late' * (1 << 18), 50 << 20)
        os.pwrite(mfd, b'late', 10 << 20)
        return 'tmp=%s named=%s big=%s memfd=%s' % (show(tmp), show(named), big_state(), digest(mfd))
    raise ValueError(cmd)

serve(handle)
