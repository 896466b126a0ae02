# git_repo_in_session: typed into a session's bash (blank and comment lines
# skipped): a git repository /root/r with one commit `one` (f holding `a`),
# the shell's cwd in it. The case's queries print the history and
# `$PWD <f> <changed files>`.
mkdir -p /root/r && cd /root/r && git init -q && echo a > f && git -c user.name=t -c user.email=t@localhost add f && git -c user.name=t -c user.email=t@localhost commit -qm one
