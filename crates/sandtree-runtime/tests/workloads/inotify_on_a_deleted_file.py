# inotify_on_a_deleted_file: an inotify watch on a file the program holds
# open and then deleted, as `tail -f` has on a log rotated away (issue 38,
# item 8: "an inotify watch on a deleted file" was refused). Commands:
# `state` -> `deleted=<its descriptor's link names a deleted file>
# wds=<from fdinfo> pending=<bytes unread>`; `write` -> a line appended, the
# events read: `<wd:mask,...>`; `close` -> the file closed (its last
# descriptor: the deleted file goes), the events read.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_DELETE_SELF = 0x2, 0x4, 0x8, 0x400
f = os.open('/root/log', os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.write(f, b'line 1\n')
ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
assert libc.inotify_add_watch(ino, b'/root/log', IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_DELETE_SELF) == 1
os.unlink('/root/log')


def events():
    buf, got, off = drain_fd(ino), [], 0
    while off + 16 <= len(buf):
        wd, mask, _, n = struct.unpack_from('iIII', buf, off)
        got.append('%d:%x' % (wd, mask))
        off += 16 + n
    return ','.join(got)


assert events() == '1:4', 'the unlink shows as IN_ATTRIB'


def handle(cmd):
    if cmd == 'state':
        wds = sorted(int(l.split()[1][3:], 16) for l in open('/proc/self/fdinfo/%d' % ino) if l.startswith('inotify'))
        link = os.readlink('/proc/self/fd/%d' % f)
        return 'deleted=%s wds=%s pending=%d' % (link.endswith(' (deleted)'), wds, avail(ino))
    if cmd == 'write':
        os.write(f, b'more\n')
        return events()
    if cmd == 'close':
        os.close(f)
        return events()
    raise ValueError(cmd)


serve(handle)
