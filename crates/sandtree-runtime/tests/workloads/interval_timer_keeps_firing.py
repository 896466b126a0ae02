# interval_timer_keeps_firing: ITIMER_REAL every 20 ms, its SIGALRMs counted.
# Commands: `state` -> `interval= armed= ticks=` (ticks move with time);
# `mutate` -> disarms it: `stopped`.
ticks = 0
def on_alarm(sig, frame):
    global ticks
    ticks += 1
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.02, 0.02)

def handle(cmd):
    if cmd == 'state':
        value, interval = signal.getitimer(signal.ITIMER_REAL)
        return 'interval=%.3f armed=%d ticks=%d' % (interval, int(value > 0), ticks)
    if cmd == 'mutate':
        signal.setitimer(signal.ITIMER_REAL, 0)
        return 'stopped'
    raise ValueError(cmd)

serve(handle)
