# session_shell_state: typed into a session's bash one line at a time
# (blank and comment lines skipped): cwd /root/sess, an exported and a local
# variable, noclobber, an alias `hi` (-> `alias-ck`), a marker in the
# history. The case's report line prints `$PWD|$SV|$LV|<noclobber or
# clobber>|<type of hi>|<ck markers in the history>|<mutation markers>`.
mkdir -p /root/sess && cd /root/sess && export SV=ck && LV=local-ck && set -o noclobber
alias hi='echo alias-ck'
echo ck-marker
