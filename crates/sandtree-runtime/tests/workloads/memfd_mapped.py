# memfd_mapped: a 1 MiB memfd mapped shared (`ck` at 0 and at 512 KiB) and
# mapped private (4 pages: the first read from the memfd, the second
# written here: `own`), shared with a forked child that holds the same
# descriptor and mappings (issue 38, item 8: a memfd mapping, or a memfd
# shared between processes, was refused).
# Commands: `state` -> `shared=<at 0>,<at 512 KiB> private=<page 0>,<page
# 1> late=<at 700 KiB> pos=<offset> child=<what the child sees at 0>`;
# `mutate` -> writes through the mapping, the descriptor, and moves the
# offset, then as `state`; `child` -> the child writes `CH` at 0: as
# `state` (the parent sees it: still one memfd).
import mmap

m = os.memfd_create('mapped')
os.ftruncate(m, 1 << 20)
shared = mmap.mmap(m, 1 << 20, mmap.MAP_SHARED)
shared[0:2] = b'ck'
shared[512 << 10:(512 << 10) + 2] = b'ck'
private = mmap.mmap(m, 4 << 12, mmap.MAP_PRIVATE)
private[4096:4099] = b'own'
os.lseek(m, 3, os.SEEK_SET)

to_child_r, to_child_w = os.pipe()
from_child_r, from_child_w = os.pipe()
if os.fork() == 0:
    while True:
        cmd = os.read(to_child_r, 16)
        if not cmd:
            os._exit(0)
        if cmd == b'w':
            shared[0:2] = b'CH'
        os.write(from_child_w, bytes(shared[0:2]) + bytes(private[0:2]))
os.close(to_child_r)
os.close(from_child_w)


def child(cmd):
    os.write(to_child_w, cmd)
    return os.read(from_child_r, 16).decode()


def state():
    return 'shared=%s,%s private=%s,%s late=%r pos=%d child=%s' % (
        bytes(shared[0:2]).decode(), bytes(shared[512 << 10:(512 << 10) + 2]).decode(),
        bytes(private[0:2]).decode(), bytes(private[4096:4099]).decode(),
        os.pread(m, 4, 700 << 10), os.lseek(m, 0, os.SEEK_CUR), child(b'r'))


def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        shared[0:2] = b'MU'
        shared[512 << 10:(512 << 10) + 2] = b'MU'
        os.pwrite(m, b'late', 700 << 10)
        os.lseek(m, 5, os.SEEK_SET)
        return state()
    if cmd == 'child':
        child(b'w')
        return state()
    raise ValueError(cmd)


serve(handle)
