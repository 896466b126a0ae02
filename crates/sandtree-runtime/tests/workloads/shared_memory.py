# State: four kinds of shared memory, shared by this process and a forked
# child (which its parent makes again at a restore): 1 MiB of shared
# anonymous memory (`mmap(MAP_SHARED | MAP_ANONYMOUS)`), a SysV segment
# (`shmget`/`shmat`), a `multiprocessing.Value` with its lock (a deleted
# file of /dev/shm, mapped and held open, and a POSIX semaphore, another
# deleted /dev/shm file, mapped), and a named POSIX shared memory object
# (`multiprocessing.shared_memory`, /dev/shm/sandtree_shm, mapped and held
# open).
# Commands: `state`: the value in each kind as this process and the child
# see it, a byte of the anonymous memory written only after the
# checkpoint (`late`, 0 at it), the value's lock taken and released from
# here; `set N`: this process writes N into every kind and `late`; `child
# N`: the child writes N into every kind (this process must see it: the
# memory is still shared after a restore).
import ctypes, mmap, os, struct
import multiprocessing as mp
from multiprocessing import shared_memory

libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
shmid = libc.shmget(0, 65536, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
assert shmid >= 0, ctypes.get_errno()
sysv = (ctypes.c_char * 65536).from_address(libc.shmat(shmid, None, 0))

anon = mmap.mmap(-1, 1 << 20)
value = mp.get_context('fork').Value('i', 0)
named = shared_memory.SharedMemory(name='sandtree_shm', create=True, size=8192)
LATE = 900 << 10


def put(n):
    anon[0:4] = struct.pack('i', n)
    anon[512 << 10:(512 << 10) + 4] = struct.pack('i', n)
    sysv[40000:40004] = struct.pack('i', n)
    with value.get_lock():
        value.value = n
    named.buf[4096:4100] = struct.pack('i', n)


def get():
    a = struct.unpack('i', anon[0:4])[0]
    a2 = struct.unpack('i', anon[512 << 10:(512 << 10) + 4])[0]
    s = struct.unpack('i', bytes(sysv[40000:40004]))[0]
    n = struct.unpack('i', bytes(named.buf[4096:4100]))[0]
    return f'{a},{a2},{s},{value.value},{n}'


put(11)
to_child_r, to_child_w = os.pipe()
from_child_r, from_child_w = os.pipe()
child = os.fork()
if child == 0:
    os.close(to_child_w)
    os.close(from_child_r)
    while True:
        cmd = os.read(to_child_r, 64).decode()
        if not cmd:
            os._exit(0)
        if cmd.startswith('w'):
            put(int(cmd[1:]))
        os.write(from_child_w, get().encode())
os.close(to_child_r)
os.close(from_child_w)


def ask_child(cmd):
    os.write(to_child_w, cmd.encode())
    return os.read(from_child_r, 256).decode()


def handle(cmd):
    if cmd.startswith('set '):
        n = int(cmd[4:])
        put(n)
        anon[LATE] = n
    elif cmd.startswith('child '):
        ask_child('w' + cmd[6:])
    locked = value.get_lock().acquire(timeout=2)
    if locked:
        value.get_lock().release()
    return f'parent={get()} child={ask_child("r")} late={anon[LATE]} lock={locked}'


serve(handle)
