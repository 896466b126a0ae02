# guard_region_between_checkpoints: three private anonymous pages, written;
# `guard` makes the middle one a guard region (MADV_GUARD_INSTALL: a touch
# of it is SIGSEGV). Installed between two checkpoints, it must be in the
# second one's restore too (its template is made from the first's standby,
# `incremental.rs`: the guard shows only in the pages written since).
# Commands: `guard` -> `guarded`; `probe` -> `faults=<pages whose write
# kills a forked child>` (a fork keeps guard regions).
import ctypes, mmap

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_GUARD_INSTALL = 102
pages = mmap.mmap(-1, 3 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
pages.write(b'x' * 3 * 4096)
addr = ctypes.addressof(ctypes.c_char.from_buffer(pages))


def probe():
    faults = []
    for i in range(3):
        pid = os.fork()
        if pid == 0:
            ctypes.memset(addr + i * 4096, 0x41, 1)
            os._exit(0)
        _, st = os.waitpid(pid, 0)
        if os.WIFSIGNALED(st):
            faults.append(str(i))
    return 'faults=' + (','.join(faults) or 'none')


def handle(cmd):
    if cmd == 'guard':
        if libc.madvise(addr + 4096, 4096, MADV_GUARD_INSTALL) != 0:
            return 'madvise: errno %d' % ctypes.get_errno()
        return 'guarded'
    if cmd == 'probe':
        return probe()
    raise ValueError(cmd)


serve(handle)
