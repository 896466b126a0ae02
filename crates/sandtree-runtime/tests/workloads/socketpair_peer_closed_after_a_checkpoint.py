# socketpair_peer_closed_after_a_checkpoint: a unix stream socket pair
# between this program and a process it started (forked twice: a child of
# init and a session leader, as templates need); that process answers `ping` with `pong` and
# exits on `quit`, closing its end. A checkpoint must not keep that end
# open (issue 36, class 1): the program then reads the end of the stream.
# Children are reaped by the kernel (SIGCHLD ignored). Descriptor 255 is
# open, under a limit of 256.
# Commands: `state` -> `child=<its answer to ping> timeout=<the end's>
# rcvbuf=<SO_RCVBUF> sndtimeo=<SO_SNDTIMEO> creds=<mine if SO_PEERCRED
# names this program>`; `close` -> asks the child
# to quit, then waits (at most 3 s) for the end of the stream: `peer=eof`
# when it came.

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
# Larger than the child (a restore brings the smaller back first): the
# pair's credentials must still name this program, which made it.
ballast = bytearray(16 << 20)
# A descriptor on the highest number the limit allows (as bash's 255
# under `ulimit -n 256`): the restore has no room above this process's
# numbers for the new pair, made on numbers of its image.
import resource
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.dup2(os.open('/dev/null', os.O_RDONLY), 255)
# A receive buffer and a send timeout of its own (the kernel doubles the
# size asked), kept by the pair made anew.
mine.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 12345)
mine.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack('ll', 2, 500000))
mine.settimeout(3)


def handle(cmd):
    if cmd == 'state':
        mine.sendall(b'ping')
        sndtimeo = struct.unpack('ll', mine.getsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, 16))
        pid = struct.unpack('3i', mine.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[0]
        return 'child=%s timeout=%s rcvbuf=%d sndtimeo=%d.%06d creds=%s' % (
            mine.recv(64).decode(), mine.gettimeout(), mine.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF), *sndtimeo,
            'mine' if pid == os.getpid() else 'pid %d' % pid)
    if cmd == 'close':
        mine.sendall(b'quit')
        try:
            got = mine.recv(64)
        except socket.timeout:
            return 'peer=open'
        return 'peer=eof' if got == b'' else 'peer=%r' % got
    raise ValueError(cmd)


serve(handle)
