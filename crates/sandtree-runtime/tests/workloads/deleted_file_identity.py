# State: a deleted-but-open file with an identity of its own: owner
# 1234:1235, mode 0645, its modification time set, data at its start and its end and a hole of
# 1 MiB between (sparse). And, on `linked`, a file deleted under one name
# but still linked under another (which a copy would not be).
# Commands: `state` -> `owner=<uid>:<gid> mode=<octal> size=<n> segments=<off+len,...>
# mtime=<ns>` (read without reading the file: its access time is left
# alone); `mutate` changes all of them; `linked` / `unlinked` open and
# close the file still linked elsewhere.

f = open('/root/sparse.bin', 'w+b')
f.write(b'head')
f.seek(1 << 20)
f.write(b'tail')
f.flush()
os.chown('/root/sparse.bin', 1234, 1235)
os.chmod('/root/sparse.bin', 0o645)
os.utime('/root/sparse.bin', ns=(1_000_000_000_123_456_789, 1_000_000_001_987_654_321))
os.unlink('/root/sparse.bin')
linked = None


def segments(fd):
    out, at = [], 0
    size = os.fstat(fd).st_size
    while at < size:
        try:
            start = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:
            break
        end = os.lseek(fd, start, os.SEEK_HOLE)
        out.append('%d+%d' % (start, end - start))
        at = end
    return ','.join(out)


def handle(cmd):
    global linked
    if cmd == 'state':
        st = os.fstat(f.fileno())
        pos = f.tell()
        segs = segments(f.fileno())
        f.seek(pos)
        return 'owner=%d:%d mode=%o size=%d segments=%s mtime=%d' % (
            st.st_uid, st.st_gid, st.st_mode & 0o7777, st.st_size, segs, st.st_mtime_ns)
    if cmd == 'mutate':
        os.fchown(f.fileno(), 4321, 4321)
        os.fchmod(f.fileno(), 0o600)
        f.seek(1 << 19)
        f.write(b'middle')
        f.flush()
        os.utime(f.fileno(), ns=(2_000_000_000_000_000_000, 2_000_000_000_000_000_000))
        return handle('state')
    if cmd == 'linked':
        with open('/root/one.txt', 'w') as w:
            w.write('one')
        os.link('/root/one.txt', '/root/two.txt')
        linked = open('/root/one.txt')
        os.unlink('/root/one.txt')
        return 'linked'
    if cmd == 'unlinked':
        linked.close()
        linked = None
        return 'unlinked'
    return 'unknown'


serve(handle)
