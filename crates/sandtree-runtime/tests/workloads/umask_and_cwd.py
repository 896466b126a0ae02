# umask_and_cwd: umask 027, cwd /root/ck-dir (which holds a file `marker`).
# Commands: `state` -> `umask= Umask=<from /proc/self/status> cwd=
# probe=<mode of a file created 0777 in the cwd> marker=<in the cwd>`;
# `mutate-rename` -> umask 002, the cwd renamed to /root/moved, then as
# `state`; `mutate-chdir` -> umask 077, cwd /tmp/elsewhere, then as `state`.
os.umask(0o027)
os.makedirs('/root/ck-dir')
open('/root/ck-dir/marker', 'w').close()
os.chdir('/root/ck-dir')

def state():
    u = os.umask(0)
    os.umask(u)
    fd = os.open('probe', os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o777)
    mode = os.fstat(fd).st_mode & 0o777
    os.close(fd)
    os.unlink('probe')
    return 'umask=%03o Umask=%s cwd=%s probe=%03o marker=%s' % (
        u, status('Umask'), os.getcwd(), mode, os.path.exists('marker'))

def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate-rename':
        os.umask(0o002)
        os.rename('/root/ck-dir', '/root/moved')
        return state()
    if cmd == 'mutate-chdir':
        os.umask(0o077)
        os.makedirs('/tmp/elsewhere', exist_ok=True)
        os.chdir('/tmp/elsewhere')
        return state()
    raise ValueError(cmd)

serve(handle)
