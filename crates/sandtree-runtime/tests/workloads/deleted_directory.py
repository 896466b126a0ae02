# deleted_directory: /root/gonedir (mode 0751) open as a directory, then
# removed (issue 38, item 7: deleted directories were refused).
# Commands: `state` -> `link=<its fd's link> mode=<mode> entries=<count>
# mtime=<seconds>`; `mutate` -> its mode changed to 0700, then as
# `state`; `make` -> a file made in it: `make=errno<n>` (a removed
# directory takes no new entry).

os.makedirs('/root/gonedir')
d = os.open('/root/gonedir', os.O_RDONLY | os.O_DIRECTORY)
os.chmod('/root/gonedir', 0o751)
os.utime(d, (1000000, 1000000))
os.rmdir('/root/gonedir')


def handle(cmd):
    if cmd == 'state':
        st = os.fstat(d)
        return 'link=%s mode=%o entries=%d mtime=%d' % (
            os.readlink('/proc/self/fd/%d' % d), st.st_mode & 0o7777, len(os.listdir(d)), st.st_mtime)
    if cmd == 'mutate':
        os.fchmod(d, 0o700)
        return handle('state')
    if cmd == 'make':
        try:
            os.close(os.open('x', os.O_CREAT | os.O_WRONLY, dir_fd=d))
            return 'make=ok'
        except OSError as e:
            return 'make=errno%d' % e.errno
    raise ValueError(cmd)


serve(handle)
