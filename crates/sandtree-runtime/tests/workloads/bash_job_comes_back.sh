# bash_job_comes_back: typed into a session's bash (blank and comment lines
# skipped): a shell variable X=kept and two background jobs (children of
# bash, `sleep`, each in a process group of its own), the first running,
# its pid written to /root/job, the second stopped (as Ctrl-Z stops one).
X=kept; sleep 1000 & echo $! > /root/job
sleep 2000 & kill -STOP $!
jobs > /dev/null
