# State: a second thread that blocks SIGUSR1 and SIGUSR2, with SIGUSR1 sent
# to it alone (pthread_kill: pending for that thread, not the process) and
# SIGUSR2 sent to it alone twice (a standard signal is queued once).
# Commands:
# - `state`: the thread's own pending set and the process's shared one
#   (`SigPnd` and `ShdPnd` of its status);
# - `mutate`: the thread takes its pending signals (sigtimedwait);
# - `take`: the thread takes them now: each signal and its si_code, in
#   order.

import threading

go, done = threading.Event(), threading.Event()
result = []


def worker():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})
    ready.set()
    while True:
        go.wait()
        go.clear()
        got = []
        while True:
            info = signal.sigtimedwait({signal.SIGUSR1, signal.SIGUSR2}, 0)
            if info is None:
                break
            got.append('%d/%d' % (info.si_signo, info.si_code))
        result[:] = [','.join(got) or 'none']
        done.set()


ready = threading.Event()
t = threading.Thread(target=worker, daemon=True)
t.start()
ready.wait()
signal.pthread_kill(t.ident, signal.SIGUSR1)
signal.pthread_kill(t.ident, signal.SIGUSR2)
signal.pthread_kill(t.ident, signal.SIGUSR2)


def handle(cmd):
    if cmd == 'state':
        with open('/proc/self/task/%d/status' % t.native_id) as f:
            own = [l.split()[1] for l in f if l.startswith('SigPnd:')][0]
        return 'thread=%s process=%s' % (own, status('ShdPnd'))
    if cmd in ('mutate', 'take'):
        done.clear()
        go.set()
        done.wait(5)
        return 'took=%s' % result[0]
    return 'unknown'


serve(handle)
