# timerfd_stays_armed: three timerfds: a periodic one (20 ms) read all the
# time, its expirations added up in `total`; a one-shot one that expired
# long before the checkpoint and is never read; a periodic one (10 ms) never
# read.
# Commands: `state` -> `interval_ns= armed=` of the first, `oneshot_ticks=`
# (unread), `unread_interval_ns= unread_armed=` of the third, `total=` (moves
# with time); `mutate` -> disarms the first and reads the one-shot one, then
# as `state`.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
class Ts(ctypes.Structure):
    _fields_ = [('sec', ctypes.c_long), ('nsec', ctypes.c_long)]
class Its(ctypes.Structure):
    _fields_ = [('interval', Ts), ('value', Ts)]
tfd = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
if tfd < 0:
    raise OSError(ctypes.get_errno(), 'timerfd_create')

def arm(ns):
    if libc.timerfd_settime(tfd, 0, ctypes.byref(Its(Ts(0, ns), Ts(0, ns))), None) < 0:
        raise OSError(ctypes.get_errno(), 'timerfd_settime')

arm(20000000)
# A one-shot timer that expires long before the checkpoint and is never
# read: one unread tick.
oneshot = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
if libc.timerfd_settime(oneshot, 0, ctypes.byref(Its(Ts(0, 0), Ts(0, 10000000))), None) < 0:
    raise OSError(ctypes.get_errno(), 'timerfd_settime')
# A periodic timer that is never read: it has always expired (unread)
# when the checkpoint looks at it.
unread = libc.timerfd_create(time.CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
if libc.timerfd_settime(unread, 0, ctypes.byref(Its(Ts(0, 10000000), Ts(0, 10000000))), None) < 0:
    raise OSError(ctypes.get_errno(), 'timerfd_settime')
total = 0
def idle():
    global total
    select.select([tfd], [], [], 0.05)
    try:
        total += int.from_bytes(os.read(tfd, 8), 'little')
    except BlockingIOError:
        pass

def setting(fd):
    cur = Its()
    if libc.timerfd_gettime(fd, ctypes.byref(cur)) < 0:
        raise OSError(ctypes.get_errno(), 'timerfd_gettime')
    armed = int(cur.value.sec != 0 or cur.value.nsec != 0)
    return cur.interval.sec * 10**9 + cur.interval.nsec, armed

def state():
    interval, armed = setting(tfd)
    unread_interval, unread_armed = setting(unread)
    with open('/proc/self/fdinfo/%d' % oneshot) as f:
        ticks = [l.split()[1] for l in f if l.startswith('ticks:')][0]
    return 'interval_ns=%d armed=%d oneshot_ticks=%s unread_interval_ns=%d unread_armed=%d total=%d' % (
        interval, armed, ticks, unread_interval, unread_armed, total)

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        arm(0)
        try:
            os.read(oneshot, 8)
        except BlockingIOError:
            pass
        return state()
    raise ValueError(cmd)

serve(handle, idle=idle)
