# pending_signal_siginfo: pending signals in detail, all blocked: a
# thread-directed one (SIGUSR1 by tgkill: in SigPnd), a process-wide one
# (SIGUSR2 by kill: in ShdPnd) and a real-time signal queued twice with the
# values 7 and 8 (sigqueue).
# Commands: `state` -> `pending=<sigpending> SigPnd= ShdPnd=` (from
# /proc/self/status); `consume` -> takes them all with sigtimedwait:
# `got=<signo/si_code/si_pid[/si_value],...>`.
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
RT = int(signal.SIGRTMIN)
sigs = [signal.SIGUSR1, signal.SIGUSR2, RT]
signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
mask = (ctypes.c_ulong * 16)()
for s in sigs:
    mask[0] |= 1 << (int(s) - 1)

def queue(sig, value):
    if libc.sigqueue(os.getpid(), sig, ctypes.c_long(value)) < 0:
        raise OSError(ctypes.get_errno(), 'sigqueue')

os.kill(os.getpid(), signal.SIGUSR2)
signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
queue(RT, 7)
queue(RT, 8)
CODES = {0: 'user', -6: 'tkill', -1: 'queue'}

def state():
    pending = ','.join(str(int(s)) for s in sorted(signal.sigpending())) or '-'
    return 'pending=%s SigPnd=%s ShdPnd=%s' % (pending, status('SigPnd'), status('ShdPnd'))

def consume():
    zero = (ctypes.c_long * 2)(0, 0)
    out = []
    while True:
        info = ctypes.create_string_buffer(128)
        if libc.sigtimedwait(ctypes.byref(mask), info, ctypes.byref(zero)) < 0:
            break
        signo, _, code = struct.unpack_from('iii', info.raw, 0)
        pid, value = struct.unpack_from('i', info.raw, 16)[0], struct.unpack_from('i', info.raw, 24)[0]
        item = '%d/%s/%s' % (signo, CODES.get(code, code), 'self' if pid == os.getpid() else 'pid%d' % pid)
        if code == -1:
            item += '/%d' % value
        out.append(item)
    return 'got=%s' % (','.join(out) or '-')

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'consume':
        return consume()
    raise ValueError(cmd)

serve(handle)
