# pty_master_closed_after_a_checkpoint: a pseudo-terminal this program
# made (os.openpty), its slave the controlling terminal of a process it
# started (forked twice, a session leader: a child of init, as templates
# need), which answers each line `ping` with `pong`, written to /dev/tty.
# The terminal has a window size of its own and echo off. Closing the master must hang the
# terminal up, checkpoint or not (issue 36, class 1): the process then gets
# SIGHUP and dies.
# Commands: `state` -> `tty=<slave's name> size=<rows>x<cols> echo=<on|off>
# child=<its answer>`; `leave` -> `ping`s the process and lets its answer
# wait unread on the master: `waiting=<bytes>`; `waiting` -> the same,
# without a ping; `collect` -> reads what waits: `got=<it>`; `close` -> closes the master and waits (at most 3 s)
# for the process to be gone: `child=gone`.

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
master, slave = os.openpty()
name = os.ttyname(slave)
fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack('HHHH', 33, 77, 0, 0))
attrs = termios.tcgetattr(slave)
attrs[3] &= ~termios.ECHO
termios.tcsetattr(slave, termios.TCSANOW, attrs)
r, w = os.pipe()
if os.fork() == 0:
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    os.close(master)
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    # (Its answers go out through /dev/tty: that descriptor names the pty
    # too, and must not keep it from being made anew.)
    devtty = os.open('/dev/tty', os.O_RDWR)
    os.write(w, str(os.getpid()).encode())
    os.close(w)
    os.close(r)
    tty = os.fdopen(slave, 'r+b', buffering=0)
    while True:
        line = tty.readline()
        if not line:
            os._exit(0)
        os.write(devtty, b'pong\n' if line.strip() == b'ping' else b'what\n')
os.close(w)
child = int(os.read(r, 32))
os.close(r)
os.close(slave)


def answer():
    os.write(master, b'ping\n')
    got = b''
    deadline = time.time() + 3
    while not got.endswith(b'\n') and time.time() < deadline:
        if select.select([master], [], [], 0.1)[0]:
            got += os.read(master, 64)
    return got.decode().strip()


def handle(cmd):
    if cmd == 'state':
        rows, cols, _, _ = struct.unpack('HHHH', fcntl.ioctl(master, termios.TIOCGWINSZ, b'\0' * 8))
        echo = 'on' if termios.tcgetattr(master)[3] & termios.ECHO else 'off'
        return 'tty=%s size=%dx%d echo=%s child=%s' % (name, rows, cols, echo, answer())
    if cmd == 'leave':
        os.write(master, b'ping\n')
        deadline = time.time() + 3
        while avail(master) < 5 and time.time() < deadline:
            time.sleep(0.01)
        return 'waiting=%d' % avail(master)
    if cmd == 'waiting':
        return 'waiting=%d' % avail(master)
    if cmd == 'collect':
        got = b''
        while avail(master) > 0:
            got += os.read(master, 64)
        return 'got=%s' % got.decode().strip()
    if cmd == 'close':
        os.close(master)
        deadline = time.time() + 3
        while time.time() < deadline:
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                return 'child=gone'
            time.sleep(0.05)
        return 'child=alive'
    raise ValueError(cmd)


serve(handle)
