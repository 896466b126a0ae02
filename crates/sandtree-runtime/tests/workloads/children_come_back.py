# State: two children of this process, each keeping a count in its memory
# (and 16 MiB mapped, every other page written, and a second thread):
# `forked`, a fork of this interpreter that did not exec, and `execd`, a new
# python3 started with subprocess (exec'd), each in this process's session
# and group; the second also in a process group of its own with a pipe of
# queued bytes; `forked` shares an open file with this process (each
# `mutate` writes a line to it in both). They must come back as this
# process's children: their
# parent pid, a wait for them, their counts, their pipes; and the
# checkpoint's templates must not show among its children.
# Commands: `state`: both counts, whether each is our child (`os.waitpid`
# with WNOHANG finds it running), its parent pid, its group, and how many
# children this process has (/proc/self/task/*/children); `mutate`:
# both counts up by one and two bytes more queued for `execd`; `quit`:
# both end, and their exit statuses as a wait reports them.
import subprocess

CHILD = r'''
import mmap, os, sys, threading, time
LOG = globals().get('LOG')
# A second thread, asleep (made again at a restore).
threading.Thread(target=time.sleep, args=(1e6,), daemon=True).start()
n = 0
# Every other page of 16 MiB written: thousands of runs of pages to copy,
# and the pages between them never written (zero).
m = mmap.mmap(-1, 16 << 20, flags=mmap.MAP_PRIVATE)
for i in range(0, 16 << 20, 8192):
    m[i] = (i // 8192) % 251 + 1
while True:
    line = sys.stdin.readline()
    if not line:
        break
    cmd = line.strip()
    if cmd == 'up':
        n += 1
        m[4096] = n
        if LOG is not None:
            os.write(LOG, b'c%d\n' % n)
    elif cmd == 'quit':
        sys.stdout.write('bye\n'); sys.stdout.flush()
        os._exit(3)
    total = sum(m[i] for i in range(0, 16 << 20, 4096))
    threads = len(os.listdir('/proc/self/task'))
    sys.stdout.write('%d %d %d %d %d\n' % (n, os.getppid(), os.getpgrp(), total, threads))
    sys.stdout.flush()
'''

# One open file of both this process and `forked` (inherited: one offset).
log = os.open('/root/shared.log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
os.write(log, b'start\n')
r1, w1 = os.pipe()
r2, w2 = os.pipe()
forked = os.fork()
if forked == 0:
    os.dup2(r1, 0)
    os.dup2(w2, 1)
    for fd in (r1, w1, r2, w2):
        os.close(fd)
    exec(compile(CHILD, 'forked', 'exec'), {'LOG': log})
    os._exit(0)
os.close(r1)
os.close(w2)
to_forked, from_forked = os.fdopen(w1, 'w'), os.fdopen(r2, 'r')
execd = subprocess.Popen(['python3', '-c', CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True, process_group=0)
queue_r, queue_w = os.pipe()
os.write(queue_w, b'ab')


def ask(to, frm, cmd):
    to.write(cmd + '\n')
    to.flush()
    return frm.readline().strip()


def running(pid):
    return os.waitpid(pid, os.WNOHANG) == (0, 0)


def children():
    kids = []
    for tid in os.listdir('/proc/self/task'):
        with open('/proc/self/task/%s/children' % tid) as f:
            kids += f.read().split()
    return len(kids)


def state():
    f = ask(to_forked, from_forked, 'get').split()
    e = ask(execd.stdin, execd.stdout, 'get').split()
    me, group = os.getpid(), os.getpgrp()
    with open('/root/shared.log') as f_:
        shared = f_.read().replace('\n', '/')
    return 'forked=%s child=%s ppid=%s group=%s execd=%s child=%s ppid=%s group=%s queued=%d children=%d sums=%s,%s log=%s threads=%s,%s' % (
        f[0], running(forked), f[1] == str(me), f[2] == str(group),
        e[0], running(execd.pid), e[1] == str(me), e[2] == str(execd.pid), avail(queue_r), children(), f[3], e[3],
        shared, f[4], e[4])


def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        ask(to_forked, from_forked, 'up')
        ask(execd.stdin, execd.stdout, 'up')
        os.write(queue_w, b'cd')
        os.write(log, b'p\n')
        return state()
    if cmd == 'quit':
        ask(to_forked, from_forked, 'quit')
        ask(execd.stdin, execd.stdout, 'quit')
        a = os.waitstatus_to_exitcode(os.waitpid(forked, 0)[1])
        b = execd.wait()
        return 'forked=%d execd=%d' % (a, b)
    return 'unknown'


serve(handle)
