# posix_message_queue: a POSIX message queue `/sandtree-q` (mq_open), held
# open, with a message in it: a checkpoint refuses it by name (its
# messages cannot be read without taking them); `close` closes and
# unlinks it.
import ctypes

rt = ctypes.CDLL('librt.so.1', use_errno=True)
rt.mq_open.restype = ctypes.c_int
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
q = rt.mq_open(b'/sandtree-q', os.O_CREAT | os.O_RDWR, 0o600, None)
assert q >= 0, ctypes.get_errno()
assert rt.mq_send(q, b'hello', 5, 0) == 0, ctypes.get_errno()


def handle(cmd):
    if cmd == 'close':
        os.close(q)
        rt.mq_unlink(b'/sandtree-q')
        return 'closed'
    raise ValueError(cmd)


serve(handle)
