# nohup_server_with_workers: a server started as users start one through
# exec, `sh -c 'nohup python3 server.py &'` (sh exits at once: the server
# is a child of init in sh's process group, whose leader is gone), with a
# `multiprocessing` pool of two workers (its children). Commands: `state`
# -> `n=<its counter> pool=<what the workers computed> ppid=<its parent>
# group=<still the group it started in, not its own>`; `bump` -> `n=<one
# more>`.

import multiprocessing


def square(x):
    return x * x


pool = multiprocessing.Pool(2)
group = os.getpgrp()
n = 0


def handle(cmd):
    global n
    if cmd == 'state':
        here = os.getpgrp()
        return 'n=%d pool=%d ppid=%d group=%s' % (
            n, sum(pool.map(square, range(5))), os.getppid(), here == group != os.getpid())
    if cmd == 'bump':
        n += 1
        return 'n=%d' % n
    raise ValueError(cmd)


serve(handle)
