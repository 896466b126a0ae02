# eventfd_shared_with_a_child: a semaphore eventfd holding 2, a dup of it,
# and an epoll watching it, all shared with a forked child: one open file
# each, whoever holds it (what a restore from a durable image must make
# once and give to both, issue 39).
# Commands: `state` -> `count=<n> semaphore=<0|1>` (fdinfo); `kick <n>` ->
# the child writes 3 to the eventfd (at /root/kick<n>) and answers what its
# copy of the epoll reports; then the parent's epoll is asked:
# `child=<events> parent=<events> count=<n>`; `read` -> one read through
# the dup: `read=<value> count=<n>`.
efd = os.eventfd(0, os.EFD_SEMAPHORE | os.EFD_NONBLOCK)
dup = os.dup(efd)
ep = select.epoll()
ep.register(efd, select.EPOLLIN)
os.eventfd_write(efd, 2)
child = os.fork()
if child == 0:
    n = 0
    while True:
        n += 1
        while not os.path.exists('/root/kick%d' % n):
            time.sleep(0.005)
        os.eventfd_write(efd, 3)
        with open('/root/child%d.tmp' % n, 'w') as f:
            f.write(str(len(ep.poll(0))))
        os.rename('/root/child%d.tmp' % n, '/root/child%d' % n)


def fdinfo(key):
    with open('/proc/self/fdinfo/%d' % efd) as f:
        for line in f:
            if line.startswith(key + ':'):
                return line.split()[1]


def count():
    return int(fdinfo('eventfd-count'), 16)


def handle(cmd):
    if cmd == 'state':
        return 'count=%d semaphore=%s' % (count(), fdinfo('eventfd-semaphore'))
    if cmd.startswith('kick '):
        n = int(cmd.split()[1])
        open('/root/kick%d' % n, 'w').close()
        deadline = time.time() + 5
        while not os.path.exists('/root/child%d' % n) and time.time() < deadline:
            time.sleep(0.005)
        with open('/root/child%d' % n) as f:
            seen = f.read()
        return 'child=%s parent=%d count=%d' % (seen, len(ep.poll(0)), count())
    if cmd == 'read':
        return 'read=%d count=%d' % (os.eventfd_read(dup), count())
    raise ValueError(cmd)


serve(handle)
