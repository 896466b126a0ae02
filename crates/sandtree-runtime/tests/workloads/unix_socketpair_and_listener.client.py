# Client of unix_socketpair_and_listener.py's listener, run on its own with
# `python3 -c` (no prelude): prints what /root/sock answers, or why it could
# not connect.
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect('/root/sock')
    print(s.recv(64).decode().strip())
except OSError as e:
    print('connect failed: %r' % (e,))
