# State: a file of the layer (/root/shared.bin, 64 KiB) mapped shared and
# writable (as SQLite maps its WAL index, the `-shm` file), written through
# the mapping (`v1` at each page), its descriptor kept open.
# Commands:
# - `state`: the first bytes of each page as the mapping has them, and
#   the same bytes read through the descriptor (the file);
# - `mutate`: writes `v2` through the mapping;
# - `through`: writes `v3` at page 0 through the mapping, then reads it
#   through the descriptor: the mapping is the file's (`through=v3`).

import mmap

N = 16 * 4096
fd = os.open('/root/shared.bin', os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, N)
m = mmap.mmap(fd, N, flags=mmap.MAP_SHARED)
for i in range(0, N, 4096):
    m[i:i + 2] = b'v1'


def pages_of(data):
    return ''.join(sorted(set(data[i:i + 2].decode() for i in range(0, N, 4096))))


def handle(cmd):
    if cmd == 'state':
        return 'mapping=%s file=%s' % (pages_of(m[:]), pages_of(os.pread(fd, N, 0)))
    if cmd == 'mutate':
        for i in range(0, N, 4096):
            m[i:i + 2] = b'v2'
        return handle('state')
    if cmd == 'through':
        m[0:2] = b'v3'
        got = os.pread(fd, 2, 0).decode()
        m[0:2] = b'v1'
        return 'through=%s' % got
    return 'unknown'


serve(handle)
