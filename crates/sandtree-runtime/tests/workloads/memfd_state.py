# memfd_state: memfd `sandtree-state` (15 bytes, offset 3) with a second,
# read-only descriptor opened through /proc/self/fd; memfd `frozen` sealed
# against writes, shrinking and more seals; memfd `plain` without sealing.
# Commands: `state` -> `<fd link>:<contents>@<offset>` of the first two,
# `same=<the read-only descriptor is the same memfd> ro=<and read-only>
# seals=<of frozen>,<of plain>`; `mutate` -> overwrites, truncates and seeks
# the first: `<it as in state> via-ro=<contents through the second descriptor>`.
m = os.memfd_create('sandtree-state', os.MFD_ALLOW_SEALING)
os.write(m, b'checkpoint-data')
os.lseek(m, 3, os.SEEK_SET)
ro = os.open('/proc/self/fd/%d' % m, os.O_RDONLY)
sealed = os.memfd_create('frozen', os.MFD_ALLOW_SEALING)
os.write(sealed, b'frozen')
fcntl.fcntl(sealed, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
plain = os.memfd_create('plain', 0)

def show(fd):
    return '%s:%r@%d' % (os.readlink('/proc/self/fd/%d' % fd), os.pread(fd, 64, 0), os.lseek(fd, 0, os.SEEK_CUR))

def handle(cmd):
    if cmd == 'state':
        same = os.fstat(ro).st_ino == os.fstat(m).st_ino
        ro_mode = fcntl.fcntl(ro, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY
        return '%s %s same=%s ro=%s seals=%d,%d' % (show(m), show(sealed), same, ro_mode,
            fcntl.fcntl(sealed, fcntl.F_GET_SEALS), fcntl.fcntl(plain, fcntl.F_GET_SEALS))
    if cmd == 'mutate':
        os.pwrite(m, b'MUTATED', 0)
        os.ftruncate(m, 9)
        os.lseek(m, 1, os.SEEK_SET)
        return '%s via-ro=%r' % (show(m), os.pread(ro, 64, 0))
    raise ValueError(cmd)

serve(handle)
