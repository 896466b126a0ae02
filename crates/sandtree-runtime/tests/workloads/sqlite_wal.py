# State: a SQLite database on the layer in WAL mode (its `-wal` file, and
# its `-shm` index mapped shared), an open connection with rows 1 and 2
# committed and row 3 inserted in a transaction not committed yet (it
# holds the write lock).
# Commands:
# - `state`: the rows this connection sees, whether its transaction is
#   open, and the rows another process sees (committed ones);
# - `mutate`: commits (if open), then inserts 4 and 5 in their own
#   transactions;
# - `commit`: commits, checks the database's integrity and what another
#   process sees then.

import sqlite3, subprocess

DB = '/root/app.db'
con = sqlite3.connect(DB, isolation_level=None)
con.execute('pragma journal_mode=wal')
con.execute('create table t(x integer)')
con.execute('insert into t values (1)')
con.execute('insert into t values (2)')
con.execute('begin immediate')
con.execute('insert into t values (3)')

PEER = 'import sqlite3; c = sqlite3.connect(%r); print(",".join(str(r[0]) for r in c.execute("select x from t order by x")))' % DB


def others():
    out = subprocess.run(['python3', '-c', PEER], capture_output=True, text=True, timeout=10)
    return out.stdout.strip() or out.stderr.strip().splitlines()[-1]


def mine():
    return ','.join(str(r[0]) for r in con.execute('select x from t order by x'))


def handle(cmd):
    if cmd == 'state':
        return 'mine=%s tx=%s others=%s' % (mine(), con.in_transaction, others())
    if cmd == 'mutate':
        if con.in_transaction:
            con.execute('commit')
        con.execute('insert into t values (4)')
        con.execute('insert into t values (5)')
        return handle('state')
    if cmd == 'commit':
        con.execute('commit')
        ok = con.execute('pragma integrity_check').fetchone()[0]
        return 'mine=%s integrity=%s others=%s' % (mine(), ok, others())
    return 'unknown'


serve(handle)
