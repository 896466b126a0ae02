# xvfb_with_clients: an X server (Xvfb, display :42, its listeners at
# /tmp/.X11-unix/X42 and @/tmp/.X11-unix/X42) and a client watching the
# root window's properties (`xprop -root -spy`), which connects through the
# abstract namespace, as every libxcb client does (issue 38, item 6: a
# computer-use agent's desktop; refused before).
# Commands: `set <value>` -> property FOO of the root window set by a new
# client: `set`; `get` -> FOO as a new client reads it: `FOO=<value>`;
# `spy` -> the values of FOO the watching client saw: `seen=<v>,...`;
# `links` -> how many sockets have the server's abstract name and its path
# (a listener each, and the server's end of each connection):
# `abstract=<n> path=<n>`; `state` -> `ready`.
import subprocess

env = dict(os.environ, DISPLAY=':42')
server = subprocess.Popen(['Xvfb', ':42', '-nolisten', 'tcp'], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.time() + 10
while subprocess.run(['xprop', '-root', '-len', '1', 'FOO'], env=env, capture_output=True).returncode != 0:
    if time.time() > deadline:
        raise SystemExit('Xvfb did not start')
    time.sleep(0.05)
spy_out = open('/root/spy.log', 'w')
spy = subprocess.Popen(['xprop', '-root', '-spy'], env=env, stdout=spy_out, stderr=subprocess.DEVNULL)
# Until the watching client listens: it prints the root's properties once
# when it starts (at most one READY line), then a line per change, so two
# READY lines mean a change reached it (a `set` before that was missed
# under load: `spy` answered "seen=" at the checkpoint).
deadline = time.time() + 20
for mark in range(1000000):
    subprocess.run(['xprop', '-root', '-f', 'READY', '8s', '-set', 'READY', str(mark)], env=env, check=True, timeout=5)
    time.sleep(0.05)
    with open('/root/spy.log') as f:
        if sum(l.startswith('READY(STRING)') for l in f) >= 2:
            break
    if time.time() > deadline:
        raise SystemExit('xprop -spy did not start')


def seen():
    with open('/root/spy.log') as f:
        return [l.split('= ', 1)[1].strip().strip('"') for l in f if l.startswith('FOO(STRING)')]


def handle(cmd):
    if cmd.startswith('set '):
        value = cmd.split(' ', 1)[1]
        subprocess.run(['xprop', '-root', '-f', 'FOO', '8s', '-set', 'FOO', value], env=env, check=True, timeout=5)
        # (Until the watching client wrote it down.)
        deadline = time.time() + 3
        while value not in seen() and time.time() < deadline:
            time.sleep(0.02)
        return 'set'
    if cmd == 'get':
        out = subprocess.run(['xprop', '-root', 'FOO'], env=env, capture_output=True, text=True, timeout=5).stdout
        return 'FOO=' + (out.split('= ', 1)[1].strip().strip('"') if '= ' in out else 'none')
    if cmd == 'spy':
        return 'seen=' + ','.join(seen())
    if cmd == 'links':
        # The server's sockets by name (/proc/net/unix: a listener, and the
        # server's end of each connection through it, have its name).
        with open('/proc/net/unix') as f:
            names = [l.split()[-1] for l in f.readlines()[1:] if len(l.split()) == 8]
        return 'abstract=%d path=%d' % (names.count('@/tmp/.X11-unix/X42'), names.count('/tmp/.X11-unix/X42'))
    if cmd == 'state':
        return 'ready'
    raise ValueError(cmd)


serve(handle)
