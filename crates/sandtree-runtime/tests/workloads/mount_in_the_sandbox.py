# State: a mount the sandbox made in its tree (a tmpfs on /root/m, then a
# bind mount of /root/a on /root/b). A rollback replaces the tree, and the
# mount would be gone while the rollback said "restored exactly": the
# checkpoint must refuse it, naming it.
# Commands: `tmpfs` / `bind` mount; `umount` unmounts what was mounted:
# `mounted` / `unmounted`.
import ctypes

libc = ctypes.CDLL(None, use_errno=True)
MS_BIND = 4096
MNT_DETACH = 2
mounted = []


def mount(src, target, fstype, flags):
    os.makedirs(target, exist_ok=True)
    if libc.mount(src.encode(), target.encode(), fstype and fstype.encode(), flags, None) != 0:
        raise OSError(ctypes.get_errno(), 'mount ' + target)
    mounted.append(target)


def handle(cmd):
    if cmd == 'tmpfs':
        mount('x', '/root/m', 'tmpfs', 0)
        return 'mounted'
    if cmd == 'bind':
        os.makedirs('/root/a', exist_ok=True)
        mount('/root/a', '/root/b', None, MS_BIND)
        return 'mounted'
    if cmd == 'umount':
        while mounted:
            if libc.umount2(mounted.pop().encode(), MNT_DETACH) != 0:
                raise OSError(ctypes.get_errno(), 'umount')
        return 'unmounted'
    return 'unknown'


serve(handle)
