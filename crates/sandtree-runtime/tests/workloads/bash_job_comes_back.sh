# bash_job_comes_back: typed into a session's bash (blank and comment lines
# skipped): a shell variable X=kept and a background job (a child of bash,
# `sleep`, in a process group of its own), its pid written to /root/job.
X=kept; sleep 1000 & echo $! > /root/job
