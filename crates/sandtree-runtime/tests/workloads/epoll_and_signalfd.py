# epoll_and_signalfd: SIGUSR1 and SIGUSR2 blocked; a signalfd on SIGUSR1 and
# a pipe's read end, both in an epoll set.
# Commands: `state` -> `ready=<what the epoll reports>`; `probe` -> writes
# `x` into the pipe and sends itself SIGUSR1: `ready=<what the epoll reports
# then> got=<pipe bytes> signos=<signals read from the signalfd>`; `mutate`
# -> the pipe out of the epoll set, the signalfd moved to SIGUSR2: as `state`.
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
r, w = os.pipe()
os.set_blocking(r, False)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1, signal.SIGUSR2})

def sigset(*sigs):
    m = (ctypes.c_ulong * 16)()
    for s in sigs:
        m[0] |= 1 << (int(s) - 1)
    return m

sfd = libc.signalfd(-1, ctypes.byref(sigset(signal.SIGUSR1)), os.O_NONBLOCK | os.O_CLOEXEC)
if sfd < 0:
    raise OSError(ctypes.get_errno(), 'signalfd')
ep = select.epoll()
ep.register(r, select.EPOLLIN)
ep.register(sfd, select.EPOLLIN)
names = {r: 'pipe', sfd: 'sigfd'}

def ready():
    return ','.join(sorted(names.get(fd, str(fd)) for fd, ev in ep.poll(0))) or '-'

def drain():
    got = b''
    while True:
        try:
            d = os.read(r, 4096)
        except BlockingIOError:
            break
        got += d
    signos = []
    while True:
        try:
            info = os.read(sfd, 128)
        except BlockingIOError:
            break
        signos.append(struct.unpack_from('I', info)[0])
    return 'got=%s signos=%s' % (got.decode() or '-', ','.join(map(str, signos)) or '-')

def handle(cmd):
    if cmd == 'state':
        return 'ready=%s' % ready()
    if cmd == 'probe':
        os.write(w, b'x')
        os.kill(os.getpid(), signal.SIGUSR1)
        rd = ready()
        return 'ready=%s %s' % (rd, drain())
    if cmd == 'mutate':
        ep.unregister(r)
        if libc.signalfd(sfd, ctypes.byref(sigset(signal.SIGUSR2)), 0) < 0:
            raise OSError(ctypes.get_errno(), 'signalfd')
        return 'ready=%s' % ready()
    raise ValueError(cmd)

serve(handle)
