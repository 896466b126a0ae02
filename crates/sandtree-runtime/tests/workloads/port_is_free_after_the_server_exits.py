# port_is_free_after_the_server_exits (also stopped_process_is_refused): a
# server named by its first argument, with no other state.
# Commands: `who` -> `who=<its name> pid=<its pid>`.
import sys
def handle(cmd):
    if cmd == 'who':
        return 'who=%s pid=%d' % (sys.argv[1], os.getpid())
    raise ValueError(cmd)

serve(handle)
