# non_root_user: the program runs as user 1000 (group 1000, no
# capabilities), as programs in most images and E2B's default user do,
# with a second thread and a file of its own. A restore may not give such
# a process (or thread) its pid with clone3's set_tid (it needs
# CAP_SYS_ADMIN in the sandbox): it comes back through the sandbox's
# ns_last_pid instead (before, the checkpoint refused it). It starts in
# /root (mode 0700, root's), which it may no longer enter, and holds a file
# only root may read, opened before: a restore, done as that user, could
# neither chdir there nor open the file again, so the checkpoint refuses
# it until `forget` closes the file and `leave` takes it to /tmp.
# Commands: `forget` -> `closed`; `leave` -> `left`; `state` -> `n=<counter>
# uid=<real>,<effective> gid=<gid> cap=<CapEff> pos=<file offset>
# threads=<count> tid=<the thread's tid is its own> pipe=<bytes in its
# pipe> pair=<bytes on its socket pair>`; `mutate` adds one to n, writes a
# byte to the file and more into the pipe and the pair.
import threading

# A file only root may read, opened before the switch.
with open('/tmp/rootonly', 'w') as secret:
    secret.write('secret')
os.chmod('/tmp/rootonly', 0o600)
secret = open('/tmp/rootonly')
os.chdir("/root")
os.setgroups([])
os.setgid(1000)
os.setuid(1000)
n = 0
f = open('/tmp/non_root_user.txt', 'w+')
f.write('abc')
f.flush()
# A pipe and a socket pair of its own, holding bytes.
r, w = os.pipe()
os.write(w, b'piped')
a, b = socket.socketpair()
a.send(b'paired')
tid = []


def worker():
    tid.append(threading.get_native_id())
    while True:
        time.sleep(0.05)


threading.Thread(target=worker, daemon=True).start()
while not tid:
    time.sleep(0.01)


def handle(cmd):
    global n
    if cmd == 'state':
        own = os.path.exists('/proc/self/task/%d' % tid[0])
        return 'n=%d uid=%d,%d gid=%d cap=%s pos=%d threads=%d tid=%s pipe=%d pair=%s' % (
            n, os.getuid(), os.geteuid(), os.getgid(), status('CapEff'), f.tell(), threading.active_count(), own,
            avail(r), b.recv(64, socket.MSG_PEEK).decode())
    if cmd == 'forget':
        secret.close()
        return 'closed'
    if cmd == 'leave':
        os.chdir('/tmp')
        return 'left'
    if cmd == 'mutate':
        n += 1
        f.write('x')
        f.flush()
        os.write(w, b'more')
        a.send(b'more')
        return handle('state')
    raise ValueError(cmd)


serve(handle)
