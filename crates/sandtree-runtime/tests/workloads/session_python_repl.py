# session_python_repl: typed one line at a time into `python3 -q -i`, which
# a session's bash execs (same pid, session leader on the pty; blank and
# comment lines skipped): a list `x` and the cwd. The case's query prints
# `X=<repr of x> <cwd>`.
import os; x = [41]; x.append(42); os.chdir('/tmp')
