# bash_job_is_named_then_reparented: typed into a session's bash (blank and
# comment lines skipped): a shell variable X=kept and a background job (a
# child of bash, `sleep`), its pid written to /root/job.
X=kept; sleep 1000 & echo $! > /root/job
