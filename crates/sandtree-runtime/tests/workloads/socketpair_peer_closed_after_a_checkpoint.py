# socketpair_peer_closed_after_a_checkpoint: a unix stream socket pair
# between this program and a process it started (forked twice: a child of
# init and a session leader, as templates need); that process answers `ping` with `pong` and
# exits on `quit`, closing its end. A checkpoint must not keep that end
# open (issue 36, class 1): the program then reads the end of the stream.
# Children are reaped by the kernel (SIGCHLD ignored). Descriptor 255 is
# open, under a limit of 256.
# Commands: `state` -> `child=<its answer to ping> nonblocking=<the end's
# flag>`; `close` -> asks the child to quit, then waits (at most 3 s) for
# the end of the stream: `peer=eof` when it came.

signal.signal(signal.SIGCHLD, signal.SIG_IGN)
mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
if os.fork() == 0:
    if os.fork() != 0:
        os._exit(0)
    os.setsid()
    mine.close()
    while True:
        got = theirs.recv(64)
        if got in (b'', b'quit'):
            os._exit(0)
        theirs.sendall(b'pong' if got == b'ping' else b'what')
theirs.close()
# A descriptor on the highest number the limit allows (as bash's 255
# under `ulimit -n 256`): the restore has no room above this process's
# numbers for the new pair, made on numbers of its image.
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.dup2(os.open('/dev/null', os.O_RDONLY), 255)
mine.settimeout(3)


def handle(cmd):
    if cmd == 'state':
        mine.sendall(b'ping')
        return 'child=%s timeout=%s' % (mine.recv(64).decode(), mine.gettimeout())
    if cmd == 'close':
        mine.sendall(b'quit')
        try:
            got = mine.recv(64)
        except socket.timeout:
            return 'peer=open'
        return 'peer=eof' if got == b'' else 'peer=%r' % got
    raise ValueError(cmd)


serve(handle)
