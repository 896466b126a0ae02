# sleep_loop_keeps_ticking: a loop that sleeps 20 ms and counts a tick,
# polling for commands in between.
# Commands: `state` -> `ticks=N`.
ticks = 0
def idle():
    global ticks
    time.sleep(0.02)
    ticks += 1

def handle(cmd):
    if cmd == 'state':
        return 'ticks=%d' % ticks
    raise ValueError(cmd)

serve(handle, idle=idle)
