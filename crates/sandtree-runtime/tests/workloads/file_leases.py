# file_leases: leases on files of the layer (`fcntl(F_SETLEASE)`): a read
# lease on /root/leased_r, a write lease on /root/leased_w whose break is
# told by SIGRTMIN+1 (`F_SETSIG`) to a handler that counts it (issue 38,
# item 4: refused before).
# Commands: `state` -> `r=<F_GETLEASE> w=<F_GETLEASE> sig=<F_GETSIG>`
# (0: read, 1: write, 2: none); `break` -> opening leased_w for writing
# (non-blocking) fails with EWOULDBLOCK while the lease is broken, the
# handler is called: `open=errno<n> broken=<signal>`; `unlease` -> both
# leases given up: the state (the kernel forgets the signal with the
# lease).

F_SETSIG, F_GETSIG = 10, 11
SIG = signal.SIGRTMIN + 1
broken = []
signal.signal(SIG, lambda s, f: broken.append(s))
for name in ('leased_r', 'leased_w'):
    with open('/root/' + name, 'w') as f:
        f.write(name)
r = os.open('/root/leased_r', os.O_RDONLY)
fcntl.fcntl(r, fcntl.F_SETLEASE, fcntl.F_RDLCK)
w = os.open('/root/leased_w', os.O_RDONLY)
fcntl.fcntl(w, F_SETSIG, SIG)
fcntl.fcntl(w, fcntl.F_SETLEASE, fcntl.F_WRLCK)


def state():
    return 'r=%d w=%d sig=%d' % (fcntl.fcntl(r, fcntl.F_GETLEASE), fcntl.fcntl(w, fcntl.F_GETLEASE),
                                 fcntl.fcntl(w, F_GETSIG))


def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'break':
        del broken[:]
        try:
            os.close(os.open('/root/leased_w', os.O_WRONLY | os.O_NONBLOCK))
            opened = 'ok'
        except OSError as e:
            opened = 'errno%d' % e.errno
        deadline = time.time() + 3
        while not broken and time.time() < deadline:
            time.sleep(0.01)
        return 'open=%s broken=%s' % (opened, ','.join(str(int(s)) for s in broken) or 'none')
    if cmd == 'unlease':
        fcntl.fcntl(r, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        fcntl.fcntl(w, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return state()
    raise ValueError(cmd)


serve(handle)
