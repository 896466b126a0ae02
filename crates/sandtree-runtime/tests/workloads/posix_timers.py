# State: POSIX timers (timer_create, by raw syscalls): `beat`, CLOCK_MONOTONIC,
# SIGUSR1 with value 0x1234 every 50 ms (a handler counts them); `quiet`,
# CLOCK_REALTIME, SIGEV_NONE, armed for 1000 s with a 7 s interval;
# `idle`, CLOCK_MONOTONIC, SIGUSR2, disarmed; `thread`, CLOCK_MONOTONIC,
# SIGEV_THREAD_ID to this (main) thread, SIGUSR2, armed for 500 s.
# Commands:
# - `state`: /proc/self/timers (id, signal/value, notify kind, clock) and
#   each timer's interval and whether it is armed;
# - `mutate`: deletes `quiet`, makes another timer, disarms `beat`;
# - `fires`: whether `beat` fires within 300 ms (`fires=yes`).

import ctypes

libc = ctypes.CDLL(None, use_errno=True)
SYS_timer_create, SYS_timer_settime, SYS_timer_gettime, SYS_timer_delete, SYS_gettid = 222, 223, 224, 226, 186
SIGEV_SIGNAL, SIGEV_NONE, SIGEV_THREAD_ID = 0, 1, 4


class Sigevent(ctypes.Structure):
    _fields_ = [('value', ctypes.c_uint64), ('signo', ctypes.c_int), ('notify', ctypes.c_int),
                ('tid', ctypes.c_int), ('pad', ctypes.c_int * 11)]


class Itimerspec(ctypes.Structure):
    _fields_ = [('isec', ctypes.c_long), ('insec', ctypes.c_long), ('vsec', ctypes.c_long), ('vnsec', ctypes.c_long)]


def create(clock, signo, notify, value=0, tid=0):
    ev = Sigevent(value, signo, notify, tid)
    tid_out = ctypes.c_int(0)
    if libc.syscall(SYS_timer_create, clock, ctypes.byref(ev), ctypes.byref(tid_out)) != 0:
        raise OSError(ctypes.get_errno(), 'timer_create')
    return tid_out.value


def arm(t, value, interval):
    spec = Itimerspec(int(interval), int(interval % 1 * 1e9), int(value), int(value % 1 * 1e9))
    if libc.syscall(SYS_timer_settime, t, 0, ctypes.byref(spec), None) != 0:
        raise OSError(ctypes.get_errno(), 'timer_settime')


def get(t):
    spec = Itimerspec()
    if libc.syscall(SYS_timer_gettime, t, ctypes.byref(spec)) != 0:
        raise OSError(ctypes.get_errno(), 'timer_gettime')
    return spec


beats = [0]
signal.signal(signal.SIGUSR1, lambda *a: beats.__setitem__(0, beats[0] + 1))
signal.signal(signal.SIGUSR2, lambda *a: None)
beat = create(time.CLOCK_MONOTONIC, signal.SIGUSR1, SIGEV_SIGNAL, 0x1234)
arm(beat, 0.05, 0.05)
quiet = create(time.CLOCK_REALTIME, 0, SIGEV_NONE)
arm(quiet, 1000, 7)
idle = create(time.CLOCK_MONOTONIC, signal.SIGUSR2, SIGEV_SIGNAL)
thread = create(time.CLOCK_MONOTONIC, signal.SIGUSR2, SIGEV_THREAD_ID, 0, libc.syscall(SYS_gettid))
arm(thread, 500, 0)
ids = {'beat': beat, 'quiet': quiet, 'idle': idle, 'thread': thread}


def listed():
    out, cur = [], None
    with open('/proc/self/timers') as f:
        for line in f:
            k, v = line.split(':', 1)
            v = v.strip()
            if k == 'ID':
                cur = [v]
                out.append(cur)
            elif k == 'signal':
                cur.append(v.split('/')[0] + '/' + hex(int(v.split('/')[1], 16)))
            elif k == 'notify':
                cur.append(v.split('.')[0])
            elif k == 'ClockID':
                cur.append(v)
    return ';'.join(','.join(t) for t in sorted(out, key=lambda t: int(t[0])))


def handle(cmd):
    if cmd == 'state':
        settings = []
        for name in ('beat', 'quiet', 'idle', 'thread'):
            try:
                s = get(ids[name])
                settings.append('%s=%d.%03d,%s' % (name, s.isec, s.insec // 1000000, 'armed' if s.vsec or s.vnsec else 'off'))
            except OSError:
                settings.append('%s=gone' % name)
        return 'timers=%s %s' % (listed(), ' '.join(settings))
    if cmd == 'mutate':
        libc.syscall(SYS_timer_delete, ids['quiet'])
        create(time.CLOCK_MONOTONIC, signal.SIGUSR2, SIGEV_SIGNAL)
        arm(ids['beat'], 0, 0)
        return 'mutated'
    if cmd == 'fires':
        before = beats[0]
        time.sleep(0.3)
        return 'fires=%s' % ('yes' if beats[0] > before else 'no')
    return 'unknown'


serve(handle)
