# shell_servers_outside_their_jobs: typed into a session's bash (blank and
# comment lines skipped): X=kept; an http.server started as `(server &)`,
# which leaves it a child of init in a group whose leader (the subshell)
# is gone, in bash's session; a pipeline job whose first command (cat)
# ends at once, its second one left in the group of the gone cat; its pid
# written to /root/job, the server's to /root/server.
cd /root && echo one > v.txt && X=kept
(python3 -m http.server 7000 > /dev/null 2>&1 & echo $! > /root/server)
cat v.txt | python3 -c "import sys, time; sys.stdin.read(); time.sleep(100000)" & echo $! > /root/job
sleep 0.5
