# orphaned_process_group: a worker left as a child of init by processes
# that exited, as `sh -c 'server &'` leaves one (issue 38, item 1: "member
# of process group N led by another process" was refused), sharing a
# listener with this program, as a preforking server's workers do (such a
# listener failed the rollback with EADDRINUSE). This program binds
# 127.0.0.1:7002 and forks the worker's ancestors by argv[1]:
# - `group`: a child starts a session, its child makes a group of its own
#   and forks the worker; both exit (session and group gone, not one);
# - `session`: a child starts a session and forks the worker, and exits
#   (the worker is in the gone leader's session and group: a notebook's
#   `!server &`, sh run by pexpect in a session of its own);
# - `live`: a child makes a group of its own and forks the worker, and
#   exits: the worker is in this program's session (a background command's,
#   captured: an interactive shell's `(server &)`);
# - `pipeline`: the worker is this program's own child, in the group of a
#   sibling that exited (a shell's pipeline whose first command ended,
#   `cat data | server &`).
# The worker accepts on the shared listener and answers `w=<its counter>`;
# with argv[2] `nobody` it runs as that user (a worker that dropped its
# privileges: it could not take the listener from the program itself).
# Commands: `state` -> `ppid=<the worker's parent: init or me> pgrp=<its group is the one it
# was left in> group=<killpg(group, 0)> sid=<its session is the one it was
# left in> worker=<its answer> log=<the shared log>@<this program's
# offset in it>`; `bump` -> the worker counts one up (and writes `w` to
# the log); `log` -> `p` written to the log: `<the log>@<offset>`;
# `kill` -> the worker's group killed (SIGKILL), the worker waited for:
# `gone`.

mode = sys.argv[1]
# (A log the worker inherits: one open file, one offset for both, as a
# server's workers share its log.)
# (Root's: a worker that dropped its privileges could not open it again
# itself, as gunicorn's workers could not open their master's logs.)
log = os.open('/root/shared.log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(log, b'p')
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', 7002))
lst.listen(8)
r, w = os.pipe()


def work():
    if sys.argv[2:] == ['nobody']:
        os.chdir('/')
        os.setgroups([])
        os.setresgid(65534, 65534, 65534)
        os.setresuid(65534, 65534, 65534)
    os.close(r)
    os.write(w, str(os.getpid()).encode())
    os.close(w)
    n = 0
    while True:
        c, _ = lst.accept()
        if c.recv(16).strip() == b'bump':
            n += 1
            os.write(log, b'w')
        c.sendall(b'w=%d' % n)
        c.close()


head = os.fork()
if mode == 'pipeline':
    if head == 0:
        os.setpgid(0, 0)
        os._exit(0)
    os.setpgid(head, head)
    # (The group lives while the worker joins it: the first one is not
    # reaped before.)
    while open('/proc/%d/stat' % head).read().rsplit(')', 1)[1].split()[0] != 'Z':
        time.sleep(0.01)
    if os.fork() == 0:
        os.setpgid(0, head)
        work()
elif head == 0:
    if mode in ('group', 'session'):
        os.setsid()
    if mode == 'live':
        os.setpgid(0, 0)
    if mode == 'group':
        # (The session's leader forks the group's, which forks the worker.)
        lead = os.fork()
        if lead != 0:
            os.waitpid(lead, 0)
            os._exit(0)
        os.setpgid(0, 0)
    if os.fork() == 0:
        work()
    os._exit(0)
os.close(w)
worker = int(os.read(r, 32))
os.close(r)
os.waitpid(head, 0)
stat = open('/proc/%d/stat' % worker).read().rsplit(')', 1)[1].split()
group, session = int(stat[2]), int(stat[3])
want_session = os.getpid() if mode in ('live', 'pipeline') else head
want_group = group if mode == 'group' else head
assert session == want_session and group == want_group and (mode != 'group' or group not in (session, worker)), \
    (mode, group, session, head)


def logged():
    with open('/root/shared.log', 'rb') as f:
        return '%s@%d' % (f.read().decode(), os.lseek(log, 0, os.SEEK_CUR))


def worker_says(cmd=b'get'):
    c = socket.create_connection(('127.0.0.1', 7002), timeout=3)
    c.sendall(cmd)
    got = c.recv(64).decode()
    c.close()
    return got


def handle(cmd):
    if cmd == 'state':
        fields = open('/proc/%d/stat' % worker).read().rsplit(')', 1)[1].split()
        ppid, pgrp, sid = int(fields[1]), int(fields[2]), int(fields[3])
        try:
            os.killpg(pgrp, 0)
            alive = 'ok'
        except OSError as e:
            alive = 'errno%d' % e.errno
        parent = {1: 'init', os.getpid(): 'me'}.get(ppid, ppid)
        return 'ppid=%s pgrp=%s group=%s sid=%s worker=%s log=%s' % (
            parent, pgrp == group, alive, sid == session, worker_says(), logged())
    if cmd == 'log':
        os.write(log, b'p')
        return logged()
    if cmd == 'bump':
        return worker_says(b'bump')
    if cmd == 'kill':
        os.killpg(group, signal.SIGKILL)
        deadline = time.time() + 3
        while time.time() < deadline:
            try:
                if mode == 'pipeline':
                    # (Our child: reaped, or it stays a zombie.)
                    os.waitpid(worker, os.WNOHANG)
                os.kill(worker, 0)
            except ProcessLookupError:
                return 'gone'
            time.sleep(0.02)
        return 'alive'
    raise ValueError(cmd)


serve(handle)
