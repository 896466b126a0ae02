# restored_process_exit_is_reported: a server with no state.
# Commands: any -> `ok`.
serve(lambda cmd: 'ok')
