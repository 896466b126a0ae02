# State: epoll instances watching through descriptor numbers that were
# then dup'd and closed (the watches stay, keyed by the old numbers: their
# files are still open under the new ones): a pipe, and a TCP listener
# (which a restore makes anew). A restore can re-create a watch only under
# a number that names its file: the checkpoint must refuse them, by name.
# (Before: the listener's watch made the rollback fail with EBADF, and a
# number reused by another file got that file watched with the old data.)
# Commands: `watch` sets them up: `watching`; `unwatch` closes the epoll
# instances: `unwatched`.
import ctypes
import select

libc = ctypes.CDLL(None, use_errno=True)
held = []


class Event(ctypes.Structure):
    _pack_ = 1
    _fields_ = [('events', ctypes.c_uint32), ('data', ctypes.c_uint64)]


def watch(ep, fd, data):
    ev = Event(select.EPOLLIN, data)
    if libc.epoll_ctl(ep.fileno(), 1, fd, ctypes.byref(ev)) != 0:
        raise OSError(ctypes.get_errno(), 'epoll_ctl')


def handle(cmd):
    if cmd == 'watch':
        r, w = os.pipe()
        ep = select.epoll()
        watch(ep, r, 0x1234)
        held.extend([ep, os.dup(r), w])
        os.close(r)
        lsn = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        lsn.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        lsn.bind(('127.0.0.1', 7005))
        lsn.listen(4)
        ep2 = select.epoll()
        watch(ep2, lsn.fileno(), 0x5678)
        held.extend([ep2, os.dup(lsn.fileno())])
        os.close(lsn.detach())
        return 'watching'
    if cmd == 'unwatch':
        for h in held:
            h.close() if hasattr(h, 'close') else os.close(h)
        held.clear()
        return 'unwatched'
    return 'unknown'


serve(handle)
