# orphan_in_a_live_session: a worker left as a child of init in this
# program's session (this program, a background command, leads it and is
# captured): what an interactive shell's `(server &)` leaves. Refused by
# name (its template would keep the session's id, the leader's pid, which
# the leader's restore needs). Commands: `orphan` -> forks a child that
# makes a group of its own and forks the worker, and exits: `worker=up`;
# `stop` -> the worker killed: `worker=gone`.

worker = None


def handle(cmd):
    global worker
    if cmd == 'orphan':
        r, w = os.pipe()
        if os.fork() == 0:
            os.setpgid(0, 0)
            if os.fork() == 0:
                # (Not the harness's connection: its end is the answer's.)
                os.closerange(3, w)
                os.closerange(w + 1, 256)
                os.write(w, str(os.getpid()).encode())
                while True:
                    signal.pause()
            os._exit(0)
        os.close(w)
        worker = int(os.read(r, 32))
        os.close(r)
        os.wait()
        return 'worker=up'
    if cmd == 'stop':
        os.kill(worker, signal.SIGKILL)
        deadline = time.time() + 3
        while time.time() < deadline:
            try:
                os.kill(worker, 0)
            except ProcessLookupError:
                return 'worker=gone'
            time.sleep(0.02)
        return 'worker=alive'
    raise ValueError(cmd)


serve(handle)
