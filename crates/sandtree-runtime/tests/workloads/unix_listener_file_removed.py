# State: a unix listener whose socket file was removed after the bind:
# nothing can connect to it any more. A restore binds listeners again at
# their path, which would make the file anew (or fail, the directory gone
# too): the checkpoint must refuse it, by name.
# Commands: `listen` binds /root/run/l.sock and removes the file and its
# directory: `listening`; `close` closes the listener: `closed`.

lsock = None


def handle(cmd):
    global lsock
    if cmd == 'listen':
        os.makedirs('/root/run', exist_ok=True)
        lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        lsock.bind('/root/run/l.sock')
        lsock.listen(1)
        os.unlink('/root/run/l.sock')
        os.rmdir('/root/run')
        return 'listening'
    if cmd == 'close':
        lsock.close()
        lsock = None
        return 'closed'
    return 'unknown'


serve(handle)
