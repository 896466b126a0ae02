# eventfd_counter: a non-blocking eventfd holding 5.
# Commands: `state` -> `count=<from fdinfo>`; `read` -> `read=<value read>
# count=`; `mutate` -> reads it and adds 2: `count=`.
efd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
os.eventfd_write(efd, 5)

def count():
    with open('/proc/self/fdinfo/%d' % efd) as f:
        for line in f:
            if line.startswith('eventfd-count:'):
                return int(line.split()[1], 16)

def read():
    try:
        return os.eventfd_read(efd)
    except BlockingIOError:
        return 0

def handle(cmd):
    if cmd == 'state':
        return 'count=%d' % count()
    if cmd == 'read':
        return 'read=%d count=%d' % (read(), count())
    if cmd == 'mutate':
        read()
        os.eventfd_write(efd, 2)
        return 'count=%d' % count()
    raise ValueError(cmd)

serve(handle)
