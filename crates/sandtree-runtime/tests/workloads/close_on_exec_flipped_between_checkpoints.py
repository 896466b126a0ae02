# close_on_exec_flipped_between_checkpoints: a pipe, its read end
# close-on-exec.
# Commands: `state` -> `inheritable=<not close-on-exec>`; `flip` -> flips
# the flag, then as `state`.
r, w = os.pipe()

def handle(cmd):
    if cmd == 'state':
        return 'inheritable=%s' % os.get_inheritable(r)
    if cmd == 'flip':
        os.set_inheritable(r, not os.get_inheritable(r))
        return 'inheritable=%s' % os.get_inheritable(r)
    raise ValueError(cmd)

serve(handle)
