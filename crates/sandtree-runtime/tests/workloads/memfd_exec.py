# State: memfds holding a copy of /bin/true, one left writable and one
# sealed against writes, as programs that run code from memory keep them.
# Commands: `run` runs each through its descriptor (fexecve, i.e.
# execveat(fd, "", AT_EMPTY_PATH)) in a child and reports the exit codes
# (100 + errno when the exec fails: 126 is ETXTBSY).

F_ADD_SEALS = 1033
F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_WRITE = 2, 4, 8
code = open('/bin/true', 'rb').read()
plain = os.memfd_create('plain', 0)
os.write(plain, code)
sealed = os.memfd_create('sealed', os.MFD_ALLOW_SEALING)
os.write(sealed, code)
fcntl.fcntl(sealed, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE)


def run(fd):
    pid = os.fork()
    if pid == 0:
        try:
            os.execve(fd, ['true'], {})
        except OSError as e:
            os._exit(100 + e.errno)
    _, st = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(st)


def handle(cmd):
    if cmd == 'run':
        return 'plain=%d sealed=%d' % (run(plain), run(sealed))
    return 'unknown'


serve(handle)
