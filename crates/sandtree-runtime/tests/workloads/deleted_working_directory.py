# State: a working directory that was deleted while the process was in it
# (`rm -rf build` from another shell): made in /root/build with mode
# 0710, entered, removed.
# Commands:
# - `state`: where /proc/self/cwd points, the mode `stat(".")` gives, and
#   what reading it and making a file in it give;
# - `mutate`: moves to /root.

os.makedirs('/root/build')
os.chmod('/root/build', 0o710)
os.chdir('/root/build')
os.rmdir('/root/build')


def attempt(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def handle(cmd):
    if cmd == 'state':
        return 'cwd=%s mode=%o list=%s create=%s' % (
            os.readlink('/proc/self/cwd').replace(' ', '_'),
            os.stat('.').st_mode & 0o7777,
            attempt(lambda: os.listdir('.')),
            attempt(lambda: open('x', 'w').close()),
        )
    if cmd == 'mutate':
        os.chdir('/root')
        return 'moved'
    return 'unknown'


serve(handle)
