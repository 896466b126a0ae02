# State: a Node.js HTTP server (`node -e`, a child of this process) that
# counts requests in its memory, and a keep-alive HTTP/1.1 connection to it
# that this process holds (`http.client`), one `/inc` answered on it.
# Commands:
# - `state`: a request on the same connection: the server's count, the
#   client port the server sees, and this end's own port (the same
#   connection: the two ports match, and stay those of the checkpoint);
# - `inc`: a request that counts.

import http.client, subprocess

SERVER = r'''
const http = require('http');
let count = 0;
const srv = http.createServer((req, res) => {
  if (req.url === '/inc') count++;
  res.end(`count=${count} port=${req.socket.remotePort}`);
});
// (Idle keep-alive connections stay open.)
srv.keepAliveTimeout = 0;
srv.headersTimeout = 0;
srv.requestTimeout = 0;
srv.listen(8080, '127.0.0.1', () => console.log('ready'));
'''

node = subprocess.Popen(['node', '-e', SERVER], stdout=subprocess.PIPE)
node.stdout.readline()
conn = http.client.HTTPConnection('127.0.0.1', 8080, timeout=5)


def get(path):
    conn.request('GET', path)
    r = conn.getresponse()
    return r.read().decode()


get('/inc')


def handle(cmd):
    if cmd == 'state':
        return '%s local=%d' % (get('/get'), conn.sock.getsockname()[1])
    if cmd == 'inc':
        return get('/inc')
    return 'unknown'


serve(handle)
