# signal_mask_and_handlers: SIGUSR1 handled by h1, SIGUSR2 blocked, SIGHUP
# at its default.
# Commands: `state` -> `handler=<SIGUSR1's> blocked=<signal mask>
# hup=<SIGHUP's> h1=<runs> h2=<runs> SigBlk= SigIgn= SigCgt=` (the last three
# from /proc/self/status); `raise` -> sends itself SIGUSR1, then as `state`;
# `mutate` -> SIGUSR1 to h2, SIGHUP ignored, mask {SIGUSR1}, then as `state`.
counts = {'h1': 0, 'h2': 0}
def h1(sig, frame):
    counts['h1'] += 1
def h2(sig, frame):
    counts['h2'] += 1
signal.signal(signal.SIGUSR1, h1)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})

def state():
    blocked = ','.join(str(int(s)) for s in sorted(signal.pthread_sigmask(signal.SIG_BLOCK, []))) or '-'
    h = signal.getsignal(signal.SIGUSR1)
    hup = signal.getsignal(signal.SIGHUP)
    return 'handler=%s blocked=%s hup=%s h1=%d h2=%d SigBlk=%s SigIgn=%s SigCgt=%s' % (
        getattr(h, '__name__', h), blocked, getattr(hup, 'name', hup), counts['h1'], counts['h2'],
        status('SigBlk'), status('SigIgn'), status('SigCgt'))

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'raise':
        os.kill(os.getpid(), signal.SIGUSR1)
        return state()
    if cmd == 'mutate':
        signal.signal(signal.SIGUSR1, h2)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.pthread_sigmask(signal.SIG_SETMASK, {signal.SIGUSR1})
        return state()
    raise ValueError(cmd)

serve(handle)
