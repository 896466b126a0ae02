# http_server_serves_rolled_back_files: not the query protocol. Python's
# http.server on 127.0.0.1:7000 serving /root/www, where v.txt holds
# `version-one`; `GET /v.txt` answers the file as it is in the tree. Run
# with `sh -c` in the background: the server is the same process (exec).
set -e
mkdir -p /root/www && echo version-one > /root/www/v.txt
exec python3 -m http.server 7000 --bind 127.0.0.1 --directory /root/www
