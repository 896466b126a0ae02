# templates_from_older_standbys: 320 MiB of resident memory (a standby's fork
# takes milliseconds) and a 16 MiB private mapping without huge pages. Each
# step writes ~1,000 pages of the first (one of three sets in turn) and 32 of
# the mapping, and at every even step drops (MADV_DONTNEED) 16 of the pages
# the step before wrote into the mapping.
# Commands: `dirty` -> the next step: `step=N`; `check` -> `step=N
# same=<both are exactly what steps 1..N made> dropped=<the step before's
# first page reads as zero>`.
import mmap
P = 4096
buf = bytearray(320 << 20)   # a standby's fork takes milliseconds
buf[0::P] = b'\x01' * (len(buf) // P)
m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m.madvise(mmap.MADV_NOHUGEPAGE)
m[0::P] = b'\x02' * (len(m) // P)
step = 0

def apply(b, mm, k, drop):
    # ~1,000 pages of `buf` (one of three sets in turn: a step leaves the
    # pages the step before wrote as they were), 32 pages of `m`, and the
    # first 16 of the step before's dropped at every even step.
    at = slice(11 + (k % 3) * P * 7, None, P * 97)
    b[at] = bytes([k % 251]) * len(b[at])
    block = (k % 8) * 32 * P
    mm[block + 5:block + 32 * P:P] = bytes([k % 251]) * 32
    if k % 2 == 0:
        gone = ((k - 1) % 8) * 32 * P
        drop(gone, 16 * P)

def expected(k):
    b = bytearray(len(buf))
    b[0::P] = b'\x01' * (len(b) // P)
    mm = bytearray(len(m))
    mm[0::P] = b'\x02' * (len(mm) // P)
    def drop(at, n):
        mm[at:at + n] = bytes(n)
    for j in range(1, k + 1):
        apply(b, mm, j, drop)
    return b, mm

def handle(cmd):
    global step
    if cmd == 'dirty':
        step += 1
        apply(buf, m, step, lambda at, n: m.madvise(mmap.MADV_DONTNEED, at, n))
        return 'step=%d' % step
    if cmd == 'check':
        b, mm = expected(step)
        # (At an even step the block the step before wrote lost half its
        # pages: read back as zeros.)
        gone = ((step - 1) % 8) * 32 * P
        return 'step=%d same=%s dropped=%s' % (step, buf == b and m[:] == mm, m[gone] == 0)
    raise ValueError(cmd)

serve(handle)
