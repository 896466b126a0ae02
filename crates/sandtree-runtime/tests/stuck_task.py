# Test helper: blocks in a kernel-mode userfaultfd fault, a wait the
# cgroup freezer cannot freeze. Prints "ready" first. Used by tests/engine.rs.
import ctypes, mmap, os, struct, fcntl, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
uffd = libc.syscall(323, os.O_CLOEXEC)
assert uffd >= 0, ctypes.get_errno()
api = bytearray(struct.pack("QQQ", 0xAA, 0, 0))
fcntl.ioctl(uffd, 0xc018aa3f, api)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
addr = libc.mmap(None, 4096, 3, 0x22, -1, 0)
reg = bytearray(struct.pack("QQQQ", addr, 4096, 1, 0))
fcntl.ioctl(uffd, 0xc020aa00, reg)
r, w = os.pipe()
print("ready", flush=True)
libc.write.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
libc.write(w, addr, 4096)   # kernel-mode fault on a missing page: waits, killable, not freezable
