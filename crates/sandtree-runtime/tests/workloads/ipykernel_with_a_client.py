# State: an IPython kernel (`python3 -m ipykernel_launcher`, a child of this
# process) in which a cell set `x = 41` and defined `f`, and a client
# (jupyter_client's BlockingKernelClient) connected to it over its five
# loopback ZeroMQ channels (TCP).
# Commands:
# - `state`: a cell run now: `print(x, f(1))`, what it printed;
# - `mutate`: a cell run now: `x = 99`;
# - `next`: the next cells run: `x += 1; print(x)`.

import subprocess
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file

conn_file, _ = write_connection_file('/root/kernel.json', ip='127.0.0.1')
kernel = subprocess.Popen(['python3', '-m', 'ipykernel_launcher', '-f', conn_file],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
kc = BlockingKernelClient(connection_file=conn_file)
kc.load_connection_file()
kc.start_channels()
kc.wait_for_ready(timeout=60)


def run(code):
    out = []

    def hook(msg):
        if msg['msg_type'] == 'stream':
            out.append(msg['content']['text'])
        elif msg['msg_type'] == 'error':
            out.append('error:' + msg['content']['ename'])

    reply = kc.execute_interactive(code, timeout=20, output_hook=hook)
    return '%s:%s' % (reply['content']['status'], ''.join(out).strip().replace(' ', '_'))


run('x = 41\ndef f(v):\n    return v * 2')


def handle(cmd):
    if cmd == 'state':
        return run('print(x, f(1))')
    if cmd == 'mutate':
        return run('x = 99')
    if cmd == 'next':
        return run('x += 1; print(x)')
    return 'unknown'


serve(handle)
