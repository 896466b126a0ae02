# orphan_writes_to_the_daemons_pipe: not the query protocol. Started in the
# background with `sh -c`: starts a Python loop in a session of its own
# that prints a line every 50 ms to the stdout it inherited (the daemon's
# output pipe of this background process) and writes its pid to
# /root/orphan.pid, then exits: the loop lives on, a child of init,
# writing to a pipe whose background process is gone. (It dies of SIGPIPE
# if that pipe has no reader.)
setsid python3 -c '
import os, sys, time
open("/root/orphan.pid", "w").write(str(os.getpid()))
try:
    while True:
        print("tick", flush=True)
        time.sleep(0.05)
except BaseException as e:
    open("/root/orphan.err", "w").write(repr(e))
    raise
' &
