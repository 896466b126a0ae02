# State: a child that switched to another user (nobody) and exited, and
# that this process has not waited for yet (a zombie). A restore makes a
# zombie again as a copy of its parent, which cannot take another user's
# ids: the checkpoint must refuse it, naming it; once waited for, the
# program is checkpointed and restored as usual.
# Commands: `spawn` forks a child that becomes nobody and exits with status
# 7 at once, and waits until it is a zombie: `pid=N state=Z`; `reap` waits
# for it: `status=7`.

child = None


def handle(cmd):
    global child
    if cmd == 'spawn':
        child = os.fork()
        if child == 0:
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            os._exit(7)
        for _ in range(2000):
            if proc_stat(child)[0] == 'Z':
                break
            time.sleep(0.001)
        return 'pid=%d state=%s' % (child, proc_stat(child)[0])
    if cmd == 'reap':
        _, st = os.waitpid(child, 0)
        return 'status=%d' % os.waitstatus_to_exitcode(st)
    return 'unknown'


serve(handle)
