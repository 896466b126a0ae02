# State: pidfds of the process itself (one close-on-exec, one not) and of
# init. The template's pidfd of the process refers to the original, which
# a rollback kills: the restored process must hold a pidfd of itself.
# Commands: `state` reports the pid each pidfd refers to (`Pid:` of its
# fdinfo, -1 for a process gone), whether it is close-on-exec, and whether
# signalling through it reaches a live process (signal 0).

me = os.pidfd_open(os.getpid())
again = os.pidfd_open(os.getpid())
os.set_inheritable(again, True)
init = os.pidfd_open(1)


def pid_of(fd):
    with open('/proc/self/fdinfo/%d' % fd) as f:
        for line in f:
            if line.startswith('Pid:'):
                return int(line.split()[1])


def alive(fd):
    try:
        signal.pidfd_send_signal(fd, 0)
        return 'yes'
    except OSError as e:
        return 'no(%d)' % e.errno


def handle(cmd):
    if cmd == 'state':
        return 'me=%s again=%s init=%d inheritable=%s,%s live=%s,%s' % (
            'self' if pid_of(me) == os.getpid() else pid_of(me),
            'self' if pid_of(again) == os.getpid() else pid_of(again),
            pid_of(init),
            os.get_inheritable(me), os.get_inheritable(again),
            alive(me), alive(init))
    return 'unknown'


serve(handle)
