# thread_with_its_own_user: a second thread switches its own effective uid
# to 1000 with a raw setresuid (glibc's setresuid would switch every
# thread's). A thread made again at a restore takes the main thread's
# credentials, so the checkpoint must refuse it, by name (issue 38, any
# user); once the thread is back to root, it is restored as usual.
# Commands: `same` -> the thread takes uid 0 back: `same`; `state` ->
# `threads=<count> euid=<the thread's>`.
import ctypes
import threading

libc = ctypes.CDLL(None, use_errno=True)
SYS_setresuid = 117
switched, back = threading.Event(), threading.Event()
euid = []


def worker():
    libc.syscall(SYS_setresuid, -1, 1000, -1)
    switched.set()
    back.wait()
    libc.syscall(SYS_setresuid, -1, 0, -1)
    euid.append(os.geteuid())
    while True:
        time.sleep(0.05)


threading.Thread(target=worker, daemon=True).start()
switched.wait()


def handle(cmd):
    if cmd == 'same':
        back.set()
        while not euid:
            time.sleep(0.01)
        return 'same'
    if cmd == 'state':
        return 'threads=%d euid=%s' % (threading.active_count(), euid[0] if euid else '?')
    raise ValueError(cmd)


serve(handle)
