# private_mapping_of_a_written_file: a file mapped privately while the
# process holds it open for writing. A restore opens the file again (or a
# copy of a deleted one) while the mapping stays on the old inode, which
# the running process may write after the checkpoint: its pages not
# copied yet would show those writes, and not the restored descriptor's.
# The checkpoint must refuse it, by name (issue 36, class 5). Once the
# writable descriptor is closed (the mapping and a read-only descriptor
# kept), it is checkpointed and rolled back as usual.
# Commands: `layer` / `deleted` map /root/mapped / /root/gone (deleted
# after) with a writable descriptor open: `mapped`; `close` closes the
# writable descriptors: `closed`; `state` -> the first byte of each
# mapping; `mutate` writes into the mappings.
import mmap

maps = {}
writers = []


def mapped(name, delete):
    path = '/root/' + name
    with open(path, 'wb') as f:
        f.write(name[0].encode() * 8192)
    writers.append(os.open(path, os.O_RDWR))
    ro = os.open(path, os.O_RDONLY)
    maps[name] = mmap.mmap(ro, 8192, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    os.close(ro)
    if delete:
        os.unlink(path)
    return 'mapped'


def handle(cmd):
    if cmd == 'layer':
        return mapped('mapped', False)
    if cmd == 'deleted':
        return mapped('gone', True)
    if cmd == 'close':
        for fd in writers:
            os.close(fd)
        writers.clear()
        return 'closed'
    if cmd == 'state':
        return ' '.join('%s=%s' % (k, m[0:1].decode()) for k, m in sorted(maps.items()))
    if cmd == 'mutate':
        for m in maps.values():
            m[0:1] = b'X'
        return handle('state')
    raise ValueError(cmd)


serve(handle)
