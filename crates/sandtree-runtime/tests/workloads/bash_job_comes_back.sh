# bash_job_comes_back: typed into a session's bash (blank and comment lines
# skipped): a shell variable X=kept and three background jobs (children of
# bash, each in a process group of its own): `sleep 1000` running, its pid
# written to /root/job; `sleep 1` stopped at once (as Ctrl-Z stops one);
# `nohup sleep 3000` running.
X=kept; sleep 1000 & echo $! > /root/job
sleep 1 & kill -STOP $!
nohup sleep 3000 > /dev/null 2>&1 &
jobs > /dev/null
