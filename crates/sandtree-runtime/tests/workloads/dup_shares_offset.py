# dup_shares_offset: /root/shared.log open once and dup'd (as `> log 2>&1`
# makes); `aaaa` written through one descriptor, `bb` through the other.
# Commands: `state` -> `pos=<offset of each> content=<the file>`; `write` ->
# `cc` through one, `dd` through the other, then as `state`.
f = os.open('/root/shared.log', os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
g = os.dup(f)
os.write(f, b'aaaa')
os.write(g, b'bb')

def state():
    with open('/root/shared.log', 'rb') as h:
        content = h.read()
    return 'pos=%d,%d content=%r' % (os.lseek(f, 0, os.SEEK_CUR), os.lseek(g, 0, os.SEEK_CUR), content)

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'write':
        os.write(f, b'cc')
        os.write(g, b'dd')
        return state()
    raise ValueError(cmd)

serve(handle)
