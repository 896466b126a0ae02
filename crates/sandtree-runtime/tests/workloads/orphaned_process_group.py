# orphaned_process_group: what `sh -c 'server &'` leaves once `sh` exited (a
# daemon of init in a group whose leader is gone), with a listener it shares
# with its parent, as a preforking server's workers do (issue 38, item 1:
# "member of process group N led by another process" was refused; a
# listener held by two processes failed the rollback with EADDRINUSE). This
# program binds 127.0.0.1:7002, then forks a child that starts a session
# (the program's, a background command's, is captured: see
# `orphan_in_a_live_session`), whose child makes a group of its own and
# forks the worker; both exit: the worker, a child of init in that group
# and session, accepts on the shared listener and answers `w=<its counter>`.
# Commands: `state` -> `ppid=<the worker's> pgrp=<its group is the gone
# leader's, not its session's> group=<killpg(group, 0)> sid=<its session
# is the one the first child started>
# worker=<its answer>`; `bump` -> the worker counts one up; `kill` -> the
# group killed (SIGKILL) and the worker waited for: `gone`.

lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
lst.bind(('127.0.0.1', 7002))
lst.listen(8)
r, w = os.pipe()
head = os.fork()
if head == 0:
    os.setsid()
    leader = os.fork()
    if leader != 0:
        os.waitpid(leader, 0)
        os._exit(0)
    os.setpgid(0, 0)
    if os.fork() == 0:
        os.close(r)
        os.write(w, str(os.getpid()).encode())
        os.close(w)
        n = 0
        while True:
            c, _ = lst.accept()
            if c.recv(16).strip() == b'bump':
                n += 1
            c.sendall(b'w=%d' % n)
            c.close()
    os._exit(0)
os.close(w)
worker = int(os.read(r, 32))
os.close(r)
os.waitpid(head, 0)
# (The gone group leader's pid: the worker's group then.)
leader = int(open('/proc/%d/stat' % worker).read().rsplit(')', 1)[1].split()[2])
session = os.getsid(worker)


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
            group = 'ok'
        except OSError as e:
            group = 'errno%d' % e.errno
        return 'ppid=%d pgrp=%s group=%s sid=%s worker=%s' % (
            ppid, pgrp == leader != session, group, sid == session == head, worker_says())
    if cmd == 'bump':
        return worker_says(b'bump')
    if cmd == 'kill':
        os.killpg(leader, signal.SIGKILL)
        deadline = time.time() + 3
        while time.time() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                return 'gone'
            time.sleep(0.02)
        return 'alive'
    raise ValueError(cmd)


serve(handle)
