# pipe_keeps_buffered_bytes: a pipe holding the 5 bytes `hello`, its read
# end non-blocking.
# Commands: `state` -> `avail=<bytes waiting>`; `drain` -> `got=<bytes read>
# avail=`; `mutate` -> drains it and writes `mutated!`: `got=<drained> avail=`.
r, w = os.pipe()
os.set_blocking(r, False)
os.write(w, b'hello')

def handle(cmd):
    if cmd == 'state':
        return 'avail=%d' % avail(r)
    if cmd == 'drain':
        return 'got=%r avail=%d' % (drain_fd(r), avail(r))
    if cmd == 'mutate':
        got = drain_fd(r)
        os.write(w, b'mutated!')
        return 'got=%r avail=%d' % (got, avail(r))
    raise ValueError(cmd)

serve(handle)
