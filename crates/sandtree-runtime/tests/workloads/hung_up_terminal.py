# hung_up_terminal: the slave of a pty whose master was closed before the
# checkpoint (its /dev/pts node gone, the terminal hung up), held by this
# program and by a process it started (forked twice, a child of init, a
# session leader that had it as its controlling terminal and ignores the
# SIGHUP of the hang-up): what a shell's background jobs hold once the
# shell's session ended (issue 38, item 7: refused before as a deleted file
# that is not a regular one). Commands: `state` -> `link=<the slave fd's
# link> tty=<isatty> read=<bytes read> write=<errno> child=<its fd 0's
# link> ctty=<its tty_nr> nonblock=<the slave's O_NONBLOCK>`; `mutate` ->
# the slave made non-blocking and a new pty opened (held): `new=<its
# slave's name>`.

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
master, slave = os.openpty()
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    os.dup2(slave, 0)
    os.close(master)
    os.write(w, str(os.getpid()).encode())
    while True:
        signal.pause()
os.close(w)
child = int(os.read(r, 32))
os.close(r)
os.close(master)
# (The hang-up reached the child's session: wait for its terminal to go.)
deadline = time.time() + 3
while open('/proc/%d/stat' % child).read().rsplit(')', 1)[1].split()[4] != '0' and time.time() < deadline:
    time.sleep(0.01)


def handle(cmd):
    if cmd == 'state':
        try:
            got = len(os.read(slave, 10))
        except OSError as e:
            got = 'errno%d' % e.errno
        try:
            os.write(slave, b'x')
            wrote = 'ok'
        except OSError as e:
            wrote = 'errno%d' % e.errno
        ctty = open('/proc/%d/stat' % child).read().rsplit(')', 1)[1].split()[4]
        nonblock = bool(fcntl.fcntl(slave, fcntl.F_GETFL) & os.O_NONBLOCK)
        return 'link=%s tty=%s read=%s write=%s child=%s ctty=%s nonblock=%s' % (
            os.readlink('/proc/self/fd/%d' % slave), os.isatty(slave), got, wrote,
            os.readlink('/proc/%d/fd/0' % child), ctty, nonblock)
    if cmd == 'mutate':
        global held
        fcntl.fcntl(slave, fcntl.F_SETFL, fcntl.fcntl(slave, fcntl.F_GETFL) | os.O_NONBLOCK)
        held = os.openpty()
        return 'new=%s' % os.ttyname(held[1])
    raise ValueError(cmd)


serve(handle)
