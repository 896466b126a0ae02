# pending_signal: SIGUSR1 and SIGUSR2 blocked and pending, SIGUSR1
# thread-directed (pthread_kill), SIGUSR2 process-wide (kill); both handled.
# Commands: `state` -> `pending=<sigpending> got=<signals handled>`;
# `consume` -> forgets those handled, unblocks both and blocks them again,
# then as `state`.
import threading
got = []
def h(sig, frame):
    got.append(int(sig))
signal.signal(signal.SIGUSR1, h)
signal.signal(signal.SIGUSR2, h)
both = {signal.SIGUSR1, signal.SIGUSR2}
signal.pthread_sigmask(signal.SIG_BLOCK, both)
os.kill(os.getpid(), signal.SIGUSR2)                                # process-wide pending
signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)  # thread-directed pending

def state():
    pending = ','.join(str(int(s)) for s in sorted(signal.sigpending())) or '-'
    return 'pending=%s got=%s' % (pending, ','.join(map(str, sorted(got))) or '-')

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'consume':
        del got[:]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, both)
        signal.pthread_sigmask(signal.SIG_BLOCK, both)
        return state()
    raise ValueError(cmd)

serve(handle)
