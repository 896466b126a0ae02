# deleted_open_files: an O_TMPFILE file (never had a name) holding
# `tmpfile-ck`, and /root/gone.txt holding `named-ck`, unlinked while open.
# Commands: `state` -> `tmp=<contents>@<offset> named=<contents>@<offset>`;
# `mutate` -> appends to the first, overwrites the start of the second, then
# as `state`.
import tempfile
tmp = tempfile.TemporaryFile()          # O_TMPFILE: never had a name
tmp.write(b'tmpfile-ck'); tmp.flush()
named = open('/root/gone.txt', 'w+b')
named.write(b'named-ck'); named.flush()
os.unlink('/root/gone.txt')

def show(f):
    pos = f.tell()
    f.seek(0)
    data = f.read()
    f.seek(pos)
    return '%s@%d' % (data.decode(), pos)

def handle(cmd):
    if cmd == 'state':
        return 'tmp=%s named=%s' % (show(tmp), show(named))
    if cmd == 'mutate':
        tmp.write(b'+more'); tmp.flush()
        named.seek(0); named.write(b'NAMED'); named.flush()
        return 'tmp=%s named=%s' % (show(tmp), show(named))
    raise ValueError(cmd)

serve(handle)
