# State: two children of this process stopped by SIGTSTP (as Ctrl-Z stops a
# shell's job): the stop of `taken` was waited for (WUNTRACED), that of
# `pending` not yet; SIGCHLD is blocked and none is pending. After a
# rollback both are stopped again, only `pending`'s report waits, and no
# SIGCHLD is pending.
# Commands: `state`: each child's state letter and whether a report of its
# stop waits (`waitid(WNOWAIT)`: the signal, or none), and whether SIGCHLD
# is pending; `mutate`: both killed and reaped; `cont`: both continued and
# ended, their exit statuses.

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})


def child():
    # In a process group of its own, as a shell's job: a group whose
    # members' parent is in the same session is not orphaned, where
    # SIGTSTP would be discarded.
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        while True:
            time.sleep(0.05)
    os.setpgid(pid, pid)
    return pid


def wait_for(pid, want):
    for _ in range(2000):
        if proc_stat(pid)[0] == want:
            return
        time.sleep(0.001)


taken, pending = child(), child()
for pid in (taken, pending):
    os.kill(pid, signal.SIGTSTP)
    wait_for(pid, 'T')
os.waitpid(taken, os.WUNTRACED)
signal.sigtimedwait([signal.SIGCHLD], 0)


def report(pid):
    r = os.waitid(os.P_PID, pid, os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    return 'none' if r is None else signal.Signals(r.si_status).name


def state():
    return 'taken=%s,%s pending=%s,%s sigchld=%s' % (
        proc_stat(taken)[0], report(taken), proc_stat(pending)[0], report(pending),
        signal.SIGCHLD in signal.sigpending())


def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        for pid in (taken, pending):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        return 'killed'
    if cmd == 'cont':
        out = []
        for pid in (taken, pending):
            os.kill(pid, signal.SIGCONT)
            os.kill(pid, signal.SIGTERM)
            out.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
        return 'ended=%s' % out
    return 'unknown'


serve(handle)
