# mapping_advice: mappings marked with madvise advice (MADV_HUGEPAGE,
# MADV_NOHUGEPAGE, MADV_WIPEONFORK on a mapping never written,
# MADV_DONTDUMP, MADV_RANDOM, MADV_SEQUENTIAL), in this process and in a
# forked child (whose restore, its parent not being init, makes its
# mappings anew: a transplant; from an image, every process's are). The
# advice is the kernel's state of the mapping (`smaps`' VmFlags): it must
# come back with the restore, with the pages.
# Commands: `state` -> the advice words of each mapping, the parent's then
# the child's, and a sum of the pages; `mutate` writes other bytes and
# takes the advice back.
import mmap, os

MADV_WIPEONFORK = 18
ADVICE = [('hg', mmap.MADV_HUGEPAGE), ('nh', mmap.MADV_NOHUGEPAGE), ('wf', MADV_WIPEONFORK),
          ('dd', mmap.MADV_DONTDUMP), ('rr', mmap.MADV_RANDOM), ('sr', mmap.MADV_SEQUENTIAL)]
UNDO = {'hg': mmap.MADV_NOHUGEPAGE, 'nh': mmap.MADV_HUGEPAGE, 'wf': 19, 'dd': mmap.MADV_DODUMP,
        'rr': mmap.MADV_NORMAL, 'sr': mmap.MADV_NORMAL}
SIZE = 4 << 20

maps = {}
for word, advice in ADVICE:
    m = mmap.mmap(-1, SIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    m.madvise(advice)
    if word != 'wf':
        for i in range(0, SIZE, 4096):
            m[i] = 7
    maps[word] = m


def advice_of(pid):
    """The advice words of each of `maps`' mappings in process `pid`."""
    starts = {'%x' % __import__('ctypes').addressof(__import__('ctypes').c_char.from_buffer(m)): w
              for w, m in maps.items()}
    out, current = {}, None
    with open('/proc/%d/smaps' % pid) as f:
        for line in f:
            if line.startswith('VmFlags:'):
                if current:
                    words = [w for w in line.split()[1:] if w in UNDO]
                    out[current] = ','.join(words) or '-'
                current = None
            elif '-' in line.split()[0] and line.split()[0].split('-')[0] in starts:
                current = starts[line.split()[0].split('-')[0]]
    return ' '.join('%s:%s' % (w, out.get(w, '?')) for w, _ in ADVICE)


r, w = os.pipe()
child = os.fork()
if child == 0:
    os.close(w)
    os.read(r, 1)
    os._exit(0)


def handle(cmd):
    if cmd == 'state':
        total = sum(m[i] for m in maps.values() for i in range(0, SIZE, 4096))
        return 'parent %s | child %s | sum=%d' % (advice_of(os.getpid()), advice_of(child), total)
    if cmd == 'mutate':
        for word, m in maps.items():
            if word != 'wf':
                for i in range(0, SIZE, 4096):
                    m[i] = 9
            m.madvise(UNDO[word])
        return handle('state')
    raise ValueError(cmd)


serve(handle)
