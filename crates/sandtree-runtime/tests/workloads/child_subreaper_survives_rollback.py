# child_subreaper_survives_rollback: the process is a child subreaper.
# Commands: `state` -> `subreaper=<PR_GET_CHILD_SUBREAPER>`; `mutate` ->
# clears it: `cleared`.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

def handle(cmd):
    if cmd == 'state':
        v = ctypes.c_int(-1)
        libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(v), 0, 0, 0)
        return 'subreaper=%d' % v.value
    if cmd == 'mutate':
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        return 'cleared'
    raise ValueError(cmd)

serve(handle)
