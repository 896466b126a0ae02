# inotify_watches (also inotify_unread_events_are_refused): an inotify
# instance (non-blocking, close-on-exec) with the watch descriptors 1, 3, 4
# and 5 (2 removed): /root/w (create, delete), /root/w/f (modify), /usr/lib
# (below the layer: attrib) and the symbolic link /root/link itself
# (attrib); a dup of it, and an epoll watching it.
# Commands: `state` -> `wds=<from fdinfo> nonblock= cloexec= dup=<same
# instance> pending=<bytes unread>`; `mutate` -> creates /root/w/new, reads
# the events and adds a watch on /tmp: `<events> <as state>`; `touch` ->
# creates /root/w/after, appends to /root/w/f, touches the link: `<events as
# wd:mask:name,...> epoll=<the epoll reported them> new=<next watch descriptor>`.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
IN_MODIFY, IN_ATTRIB, IN_CREATE, IN_DELETE, IN_DONT_FOLLOW = 0x2, 0x4, 0x100, 0x200, 0x02000000
os.makedirs('/root/w', exist_ok=True)
open('/root/w/f', 'w').write('x')
if not os.path.islink('/root/link'):
    os.symlink('/root/w/f', '/root/link')
ino = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
assert libc.inotify_add_watch(ino, b'/root/w', IN_CREATE | IN_DELETE) == 1
gone = libc.inotify_add_watch(ino, b'/root', IN_CREATE)
libc.inotify_rm_watch(ino, gone)
assert libc.inotify_add_watch(ino, b'/root/w/f', IN_MODIFY) == 3
assert libc.inotify_add_watch(ino, b'/usr/lib', IN_ATTRIB) == 4
assert libc.inotify_add_watch(ino, b'/root/link', IN_ATTRIB | IN_DONT_FOLLOW) == 5
dup = os.dup(ino)
drain_fd(ino)  # the IN_IGNORED of the removed watch
ep = select.epoll()
ep.register(ino, select.EPOLLIN)

def events():
    buf, got, off = drain_fd(ino), [], 0
    while off + 16 <= len(buf):
        wd, mask, _, n = struct.unpack_from('iIII', buf, off)
        got.append('%d:%x:%s' % (wd, mask, buf[off + 16:off + 16 + n].rstrip(b'\0').decode()))
        off += 16 + n
    return ','.join(got)

def state():
    wds = sorted(int(l.split()[1][3:], 16) for l in open('/proc/self/fdinfo/%d' % ino) if l.startswith('inotify'))
    return 'wds=%s nonblock=%s cloexec=%s dup=%s pending=%d' % (
        wds, fcntl.fcntl(ino, fcntl.F_GETFL) & os.O_NONBLOCK != 0,
        fcntl.fcntl(ino, fcntl.F_GETFD) & fcntl.FD_CLOEXEC != 0,
        os.fstat(dup).st_ino == os.fstat(ino).st_ino, avail(ino))

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        open('/root/w/new', 'w').close()
        got = events()
        libc.inotify_add_watch(ino, b'/tmp', IN_CREATE)
        return '%s %s' % (got, state())
    if cmd == 'touch':
        open('/root/w/after', 'w').close()
        with open('/root/w/f', 'a') as f:
            f.write('y')
        os.utime('/root/link', follow_symlinks=False)
        ready = [fd for fd, _ in ep.poll(1)] == [ino]
        got = events()
        return '%s epoll=%s new=%d' % (got, ready, libc.inotify_add_watch(ino, b'/tmp', IN_CREATE))
    raise ValueError(cmd)

serve(handle)
