# checkpoints_while_standbys_fork (also standbys_taken_while_forking and
# standby_lost_after_the_reply): 384 MiB of resident memory, so that a
# standby's fork takes milliseconds. Each step writes one byte into ~4,200
# pages, one of three page sets in turn.
# Commands: `dirty` -> the next step: `step=N`; `check` -> `step=N
# same=<the memory is exactly what steps 1..N made, recomputed>`.
buf = bytearray(384 << 20)   # a standby's fork takes milliseconds
buf[0::4096] = b'\x01' * (len(buf) // 4096)
step = 0

def marks(b, k):
    # Step k's ~4,200 pages (writing them into a standby takes longer
    # than the next step), one byte each: one of three sets in turn, so
    # that a step leaves pages the step before wrote as they were.
    at = slice(11 + (k % 3) * 4096 * 7, None, 4096 * 23)
    b[at] = bytes([k % 251]) * len(b[at])

def expected(k):
    exp = bytearray(len(buf))
    exp[0::4096] = b'\x01' * (len(buf) // 4096)
    for j in range(1, k + 1):
        marks(exp, j)
    return exp

def handle(cmd):
    global step
    if cmd == 'dirty':
        step += 1
        marks(buf, step)
        return 'step=%d' % step
    if cmd == 'check':
        return 'step=%d same=%s' % (step, buf == expected(step))
    raise ValueError(cmd)

serve(handle)
