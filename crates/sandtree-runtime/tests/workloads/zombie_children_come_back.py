# State: seven children of this process that exited and that it has not
# waited for yet (zombies), each with a name of its own: `code` exited
# with status 7; `term` was killed by SIGTERM; `segv` by SIGSEGV (not
# dumpable: no core); `mine` exited 0 in this process's group; `leader`
# led a process group of its own and exited 3 while `member`, a live child
# of this process, is in that group; `follow` exited 9 in that group once
# its leader was a zombie; `sess` led a session of its own and
# exited 5. A SIGCHLD handler counts the SIGCHLDs this process got (one
# per child's end: each is waited for before the next starts).
# A restore must make each again as this process's zombie, with its pid,
# name, group, session and the status its wait gets, the live member in
# the zombie leader's group, and no SIGCHLD of its own making.
# Commands: `spawn`; `state`: per child, its state, name, its group and
# session as `own`, `mine` (this process's) or `leader` (the leader's),
# and its parent (`mine`, or a pid),
# and the SIGCHLDs counted; `reap`: waits for each zombie: its status.
import ctypes

libc = ctypes.CDLL(None)
kids = {}
got = [0]


def on_sigchld(sig, frame):
    got[0] += 1


signal.signal(signal.SIGCHLD, on_sigchld)


def stat_of(pid):
    with open('/proc/%d/stat' % pid) as f:
        text = f.read()
    comm = text[text.index('(') + 1:text.rindex(')')]
    rest = text.rsplit(')', 1)[1].split()
    return rest[0], comm, int(rest[2]), int(rest[3]), int(rest[1])


def child(name, body):
    """A child named `name` running `body()`; `os._exit(0)` after it."""
    pid = os.fork()
    if pid == 0:
        try:
            libc.prctl(15, name.encode())  # PR_SET_NAME
            body()
        finally:
            os._exit(0)
    kids[name] = pid
    return pid


def until(test):
    for _ in range(5000):
        if test():
            return True
        time.sleep(0.001)
    raise RuntimeError('timed out')


def ends(name, body):
    before = got[0]
    pid = child(name, body)
    until(lambda: stat_of(pid)[0] == 'Z' and got[0] == before + 1)


def ends_in_group(name, group, code, meanwhile=lambda pid: None):
    """A child named `name` put in process group `group` (its own: None),
    which exits with `code` once `meanwhile(its pid)` has run: its pid."""
    r, w = os.pipe()
    def body():
        os.close(w)
        os.read(r, 1)
        os._exit(code)
    before = got[0]
    pid = child(name, body)
    os.setpgid(pid, pid if group is None else group)
    other = meanwhile(pid)
    if other is not None:
        os.setpgid(other, pid)
    os.close(r)
    os.write(w, b'x')
    os.close(w)
    until(lambda: stat_of(pid)[0] == 'Z' and got[0] == before + 1)
    return pid


def die_by(sig):
    def body():
        signal.signal(sig, signal.SIG_DFL)
        libc.prctl(4, 0)  # PR_SET_DUMPABLE: no core
        os.kill(os.getpid(), sig)
        time.sleep(10)
    return body


def spawn():
    ends('z-code', lambda: os._exit(7))
    ends('z-term', die_by(signal.SIGTERM))
    ends('z-segv', die_by(signal.SIGSEGV))
    ends('z-mine', lambda: None)
    # The leader's group, which the member joins before the leader ends.
    def member():
        # (Not the query's connection: its client waits for its end.)
        os.closerange(3, 1024)
        while True:
            time.sleep(1000)
    leader = ends_in_group('z-leader', None, 3, lambda pid: child('member', member))
    # One more in that group, whose leader is a zombie now.
    ends_in_group('z-follow', leader, 9)
    ends('z-sess', lambda: (os.setsid(), os._exit(5)))
    return 'spawned'


def relative(pid, value):
    if value == pid:
        return 'own'
    if value == os.getpgrp():
        return 'mine'
    if value == kids.get('z-leader'):
        return 'leader'
    return 'other'


def state():
    out = []
    for name, pid in sorted(kids.items()):
        try:
            st, comm, pgid, sid, ppid = stat_of(pid)
        except FileNotFoundError:
            out.append('%s=gone' % name)
            continue
        sid_rel = 'mine' if sid == os.getsid(0) else relative(pid, sid)
        parent = 'mine' if ppid == os.getpid() else str(ppid)
        out.append('%s=%s/%s/%s/%s/%s' % (name, st, comm, relative(pid, pgid), sid_rel, parent))
    out.append('sigchld=%d' % got[0])
    return ' '.join(out)


def reap():
    out = []
    for name, pid in sorted(kids.items()):
        if name == 'member':
            continue
        try:
            _, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            # (Not our child: whose, if any.)
            try:
                parent = proc_stat(pid)[1]
            except FileNotFoundError:
                parent = 'none'
            out.append('%s=none(%s/%d)' % (name, parent, os.getpid()))
            continue
        if os.WIFEXITED(status):
            out.append('%s=exit%d' % (name, os.WEXITSTATUS(status)))
        elif os.WIFSIGNALED(status):
            out.append('%s=sig%d%s' % (name, os.WTERMSIG(status), '+core' if os.WCOREDUMP(status) else ''))
        else:
            out.append('%s=running' % name)
    return ' '.join(out)


def handle(cmd):
    if cmd == 'spawn':
        return spawn()
    if cmd == 'state':
        return state()
    if cmd == 'reap':
        return reap()
    return 'unknown'


serve(handle)
