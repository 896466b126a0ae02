# sqlite_open_database: sqlite3 with /root/app.db open (autocommit: no lock
# held between statements) and a table `t`.
# Commands: `count` -> `rows=<rows in t>`; `add` -> inserts a row, then as
# `count`.
import sqlite3
db = sqlite3.connect('/root/app.db', isolation_level=None)
db.execute('create table if not exists t(x)')

def rows():
    return 'rows=%d' % db.execute('select count(*) from t').fetchone()[0]

def handle(cmd):
    if cmd == 'count':
        return rows()
    if cmd == 'add':
        db.execute('insert into t values (1)')
        return rows()
    raise ValueError(cmd)

serve(handle)
