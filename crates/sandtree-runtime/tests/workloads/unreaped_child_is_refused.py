# State: a child that exited and that this process has not waited for yet
# (a zombie). A fork-based restore would not bring it back, and the wait
# would find no child: the checkpoint must refuse it, by name.
# Commands: `spawn` forks a child that exits with status 7 at once and
# waits until it is a zombie: `pid=N`; `reap` waits for it: `status=7`.

child = None


def state_of(pid):
    with open('/proc/%d/stat' % pid) as f:
        return f.read().rsplit(')', 1)[1].split()[0]


def handle(cmd):
    global child
    if cmd == 'spawn':
        child = os.fork()
        if child == 0:
            os._exit(7)
        for _ in range(2000):
            if state_of(child) == 'Z':
                break
            time.sleep(0.001)
        return 'pid=%d state=%s' % (child, state_of(child))
    if cmd == 'reap':
        _, st = os.waitpid(child, 0)
        return 'status=%d' % os.waitstatus_to_exitcode(st)
    return 'unknown'


serve(handle)
