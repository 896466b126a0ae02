# State: a PostgreSQL server (the host's postgres, `pg_ctl start`: the
# postmaster a child of init, its checkpointer, background writer, WAL
# writer and launchers its children, each in a session of its own; shared
# anonymous memory, a SysV segment and /dev/shm segments between them),
# running as the `postgres` user, and a `psql` client (this process's
# child, as `postgres` too) connected over the unix socket, holding a
# transaction open with one row inserted and not committed.
# Commands: `state`: the rows the client sees (`mine`), whether its
# transaction is open (`tx`: a transaction id assigned), and the rows a new
# connection sees (`others`: committed ones only); `mutate`: the client
# commits and inserts two rows more (10 and 11); `commit`: the client commits, then
# inserts one row more in a transaction of its own, then what both see,
# and a check of the table's index (`amcheck`-free: a count through an
# index scan equals a count through the table); `step`: the client
# commits, opens another transaction with one row more (through the
# index), and answers how many rows it sees.
import os, select, subprocess

DATA = '/tmp/pgdata'
SOCK = '/tmp'


def as_postgres(cmd):
    return subprocess.run(cmd, user='postgres', cwd='/tmp', capture_output=True, text=True, check=True).stdout


os.makedirs(DATA, exist_ok=True)
os.chown(DATA, *(lambda p: (p.pw_uid, p.pw_gid))(__import__('pwd').getpwnam('postgres')))
as_postgres(['initdb', '-D', DATA, '-A', 'trust', '-U', 'pg', '--no-sync'])
opts = f"-k {SOCK} -c listen_addresses='' -c fsync=off"
as_postgres(['pg_ctl', '-D', DATA, '-l', '/tmp/pg.log', '-w', '-o', opts, 'start'])

client = subprocess.Popen(
    ['psql', '-h', SOCK, '-U', 'pg', '-d', 'postgres', '-X', '-q', '-A', '-t'],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, user='postgres', cwd='/tmp')


def ask(sql):
    """`sql` run by the client; its output."""
    client.stdin.write((sql + '\n\\echo __done__\n').encode())
    client.stdin.flush()
    out = b''
    while not out.endswith(b'__done__\n'):
        if not select.select([client.stdout], [], [], 10)[0]:
            raise RuntimeError('psql did not answer: ' + out.decode())
        got = os.read(client.stdout.fileno(), 4096)
        if not got:
            raise RuntimeError('psql ended: ' + out.decode())
        out += got
    return out[:-len('__done__\n')].decode().strip()


def others():
    """The rows a new connection sees."""
    sql = "select string_agg(x::text, ',' order by x) from t"
    return as_postgres(['psql', '-h', SOCK, '-U', 'pg', '-d', 'postgres', '-X', '-A', '-t', '-c', sql]).strip()


ROWS = "select string_agg(x::text, ',' order by x) from t;"
ask('create table t (x int primary key); insert into t values (1), (2);')
ask('begin; insert into t values (3);')


def state():
    mine = ask(ROWS)
    tx = ask('select txid_current_if_assigned() is not null;')
    return f'mine={mine} tx={tx} others={others()}'


def handle(cmd):
    if cmd == 'state':
        return state()
    if cmd == 'mutate':
        ask('commit; insert into t values (10), (11);')
        return state()
    if cmd == 'step':
        # (What the bench's PostgreSQL workload does each step.)
        return ask('commit; begin; insert into t select max(x) + 1 from t; select count(*) from t;')
    if cmd == 'commit':
        # (Then one more row, through the primary key's index, in a
        # transaction of its own.)
        ask('commit; begin; insert into t select max(x) + 1 from t; commit;')
        counts = ask('set enable_seqscan = off; select count(*) from t where x > 0; '
                     'set enable_seqscan = on; set enable_indexscan = off; set enable_bitmapscan = off; '
                     'select count(*) from t where x > 0;').split()
        return f'{state()} counts={",".join(counts)}'
    return 'error unknown command'


serve(handle)
