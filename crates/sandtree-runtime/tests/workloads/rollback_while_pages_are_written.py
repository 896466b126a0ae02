# rollback_while_pages_are_written: 24 MiB of resident memory (6,144 pages).
# Commands: `dirty` -> the next step: two bytes written into each of the
# first 3,500 pages, then as `sum`; `sum` -> `step=N crc=<crc32 of it all>`.
import zlib
buf = bytearray(24 << 20)   # 6,144 pages, all resident
for off in range(0, len(buf), 4096):
    buf[off] = 1
step = 0

def handle(cmd):
    global step
    if cmd == 'dirty':
        # 3,500 pages: under the 4,096 above which a checkpoint forks.
        step += 1
        for i in range(3500):
            buf[i * 4096 + 7] = step % 251
            buf[i * 4096 + 4000] = (step * 7) % 251
    if cmd in ('dirty', 'sum'):
        return 'step=%d crc=%08x' % (step, zlib.crc32(buf))
    raise ValueError(cmd)

serve(handle)
