# State: an anonymous mapping of 1 MiB marked MADV_DONTFORK (as V8 marks
# Node's heap), filled with a pattern, and a read-only one beside it; a
# fork leaves both out.
# Commands:
# - `state`: a checksum of each mapping's bytes, and whether each is still
#   marked (`dc` in its smaps VmFlags);
# - `mutate`: overwrites the first mapping.

import mmap, zlib

N = 1 << 20
heap = mmap.mmap(-1, N, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
heap.write(bytes(i % 241 for i in range(N)))
heap.madvise(mmap.MADV_DONTFORK)
ro = mmap.mmap(-1, 4 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
ro.write(b'r' * len(ro))
ro.madvise(mmap.MADV_DONTFORK)
# (Read-only from here on, as V8 seals some of its pages.)
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
addr_ro = ctypes.addressof(ctypes.c_char.from_buffer(ro))
addr_heap = ctypes.addressof(ctypes.c_char.from_buffer(heap))
assert libc.mprotect(ctypes.c_void_p(addr_ro), len(ro), mmap.PROT_READ) == 0


def marked(addr):
    start = None
    with open('/proc/self/smaps') as f:
        for line in f:
            head = line.split(' ', 1)[0]
            if '-' in head and not line.startswith('VmFlags'):
                a, b = (int(x, 16) for x in head.split('-'))
                start = a if a <= addr < b else None
            elif line.startswith('VmFlags') and start is not None:
                return 'dc' in line.split()
    return None


def handle(cmd):
    if cmd == 'state':
        return 'heap=%x,%s ro=%x,%s' % (zlib.crc32(heap[:]), marked(addr_heap), zlib.crc32(ro[:]), marked(addr_ro))
    if cmd == 'mutate':
        heap.seek(0)
        heap.write(b'x' * N)
        return 'mutated'
    return 'unknown'


serve(handle)
