# State: unix connections a restore cannot make again yet: one through a
# listener of the abstract namespace whose name is not text (one whose
# name is, as Xvfb's, is made again: abstract_unix_connections.py), one
# whose connecting end is bound to a path itself. A checkpoint's templates would hold their ends, and a
# peer's close after it would never show: the checkpoint must refuse
# them, by name (issue 36, class 1).
# Commands: `abstract` and `bound` make a connection each (the listener,
# the connecting end and the accepted end all kept): `connected`;
# `close` closes everything: `closed`.

kept = []


def handle(cmd):
    if cmd == 'abstract':
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind(b'\0sandtree-test-\xff')
        lsock.listen(1)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.connect(b'\0sandtree-test-\xff')
        a, _ = lsock.accept()
        kept.extend([lsock, c, a])
        return 'connected'
    if cmd == 'bound':
        for p in ('/root/l.sock', '/root/c.sock'):
            if os.path.exists(p):
                os.unlink(p)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind('/root/l.sock')
        lsock.listen(1)
        c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        c.bind('/root/c.sock')
        c.connect('/root/l.sock')
        a, _ = lsock.accept()
        kept.extend([lsock, c, a])
        return 'connected'
    if cmd == 'close':
        for s in kept:
            s.close()
        kept.clear()
        return 'closed'
    return 'unknown'


serve(handle)
