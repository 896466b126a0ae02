# mapping_not_copied_by_fork: 1 MiB of anonymous memory holding a pattern,
# which `wipeonfork` marks MADV_WIPEONFORK: a copy by fork gets it zeroed,
# so a restore from a template would lose it (issue 36, class 2);
# `keeponfork` takes the mark back. (`dontfork` / `dofork` do the same
# with MADV_DONTFORK, which a checkpoint captures.) Another 64 KiB are marked
# MADV_WIPEONFORK and never written: nothing to lose, and not refused.
# Commands: `state` -> `sum=<sum of the bytes> len=<len>`; `dontfork` /
# `dofork`, `wipeonfork` / `keeponfork` -> `marked` / `unmarked`;
# `mutate` writes other bytes.
import mmap

# (Not named by Python 3.11's mmap module.)
MADV_WIPEONFORK, MADV_KEEPONFORK = 18, 19

mem = mmap.mmap(-1, 1 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for i in range(0, 1 << 20, 4096):
    mem[i:i + 4] = b'page'
empty = mmap.mmap(-1, 1 << 16, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
empty.madvise(MADV_WIPEONFORK)


def handle(cmd):
    if cmd == 'state':
        return 'sum=%d len=%d' % (sum(mem[i] for i in range(0, 1 << 20, 4096)), len(mem))
    if cmd == 'dontfork':
        mem.madvise(mmap.MADV_DONTFORK)
        return 'marked'
    if cmd == 'dofork':
        mem.madvise(mmap.MADV_DOFORK)
        return 'unmarked'
    if cmd == 'wipeonfork':
        mem.madvise(MADV_WIPEONFORK)
        return 'marked'
    if cmd == 'keeponfork':
        mem.madvise(MADV_KEEPONFORK)
        return 'unmarked'
    if cmd == 'mutate':
        for i in range(0, 1 << 20, 4096):
            mem[i:i + 4] = b'MUTE'
        return handle('state')
    raise ValueError(cmd)


serve(handle)
