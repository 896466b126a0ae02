# State: redis-server (Debian's, a child of this process, nothing saved to
# disk) holding keys in its memory, and a client connection to it that this
# process holds (RESP spoken over a plain socket), with `k` set to `v1` and
# `n` incremented to 1 on it.
# Commands:
# - `state`: on the same connection, its id (`CLIENT ID`: another
#   connection would have another), `GET k`, `GET n` and `DBSIZE`;
# - `mutate`: `SET k v2`, `INCR n`, `SET other x`.

import subprocess

server = subprocess.Popen(['redis-server', '--port', '6380', '--bind', '127.0.0.1', '--save', '',
                           '--appendonly', 'no', '--daemonize', 'no', '--loglevel', 'warning'],
                          stdout=subprocess.DEVNULL)
deadline = time.time() + 10
while True:
    try:
        conn = socket.create_connection(('127.0.0.1', 6380))
        break
    except OSError:
        if time.time() > deadline:
            raise
        time.sleep(0.05)
reader = conn.makefile('rb')


def call(*args):
    msg = b'*%d\r\n' % len(args) + b''.join(b'$%d\r\n%s\r\n' % (len(a), a.encode()) for a in args)
    conn.sendall(msg)
    line = reader.readline()
    kind, rest = line[:1], line[1:].strip()
    if kind == b'$':
        n = int(rest)
        return None if n < 0 else reader.read(n + 2)[:-2].decode()
    if kind in (b'+', b':'):
        return rest.decode()
    raise RuntimeError(line)


call('SET', 'k', 'v1')
call('INCR', 'n')


def handle(cmd):
    if cmd == 'state':
        return 'id=%s k=%s n=%s size=%s' % (call('CLIENT', 'ID'), call('GET', 'k'), call('GET', 'n'), call('DBSIZE'))
    if cmd == 'mutate':
        call('SET', 'k', 'v2')
        call('INCR', 'n')
        call('SET', 'other', 'x')
        return 'mutated'
    return 'unknown'


serve(handle)
