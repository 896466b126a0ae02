# State: a zombie child in the process group of a live child (the last
# command of a job `cat f | grep -q x` that exited before the shell waited
# for it). A restore makes the live child's group only at its own turn,
# after the zombie is made: the checkpoint must refuse it, naming it; once
# waited for, the program is checkpointed and restored as usual.
# Commands: `spawn`: the leader (alive) and the zombie in its group:
# `state=Z`; `reap` waits for the zombie: `status=4`.

zombie = None


def handle(cmd):
    global zombie
    if cmd == 'spawn':
        leader = os.fork()
        if leader == 0:
            # (Not the query's connection: its client waits for its end.)
            os.closerange(3, 1024)
            while True:
                time.sleep(1000)
        os.setpgid(leader, leader)
        r, w = os.pipe()
        zombie = os.fork()
        if zombie == 0:
            os.close(w)
            os.read(r, 1)
            os._exit(4)
        os.setpgid(zombie, leader)
        os.close(r)
        os.write(w, b'x')
        os.close(w)
        for _ in range(2000):
            if proc_stat(zombie)[0] == 'Z':
                break
            time.sleep(0.001)
        return 'state=%s' % proc_stat(zombie)[0]
    if cmd == 'reap':
        _, st = os.waitpid(zombie, 0)
        return 'status=%d' % os.waitstatus_to_exitcode(st)
    return 'unknown'


serve(handle)
