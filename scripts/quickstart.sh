#!/usr/bin/env bash
# README command one: install what is missing, build, start a daemon and run
# the demo on the embedded default image. Run as root.
#
#   DATA_DIR   state directory of the demo daemon (default /var/lib/sandtree)
#   STOP=1     stop the daemon afterwards (default: leave it running for you)
set -euo pipefail
cd "$(dirname "$0")/.."
DATA_DIR=${DATA_DIR:-/var/lib/sandtree}
if ! command -v mkfs.btrfs >/dev/null; then
    echo "==> installing btrfs-progs (for mkfs.btrfs)"
    apt-get update -qq && apt-get install -y -qq btrfs-progs >/dev/null
fi
if ! command -v nft >/dev/null && [ ! -x /usr/sbin/nft ]; then
    echo "==> installing nftables (sandboxes' networks)"
    apt-get update -qq && apt-get install -y -qq nftables >/dev/null
fi
echo "==> building (release)"
cargo build --release --locked -p sandtree 2>&1 | tail -n 2
ST=$PWD/target/release/sandtree
export SANDTREE_SOCKET=$DATA_DIR/sandtree.sock

if ! $ST info >/dev/null 2>&1; then
    echo "==> starting the daemon (data dir $DATA_DIR, log $DATA_DIR/daemon.log)"
    mkdir -p "$DATA_DIR"
    nohup "$ST" daemon --data-dir "$DATA_DIR" >"$DATA_DIR/daemon.log" 2>&1 &
    DAEMON_PID=$!
    for _ in $(seq 1 200); do $ST info >/dev/null 2>&1 && break; sleep 0.05; done
    $ST info >/dev/null || { cat "$DATA_DIR/daemon.log"; exit 1; }
    if [ "${STOP:-0}" = 1 ]; then trap 'kill $DAEMON_PID 2>/dev/null || true' EXIT; fi
fi
"$ST" demo
if [ "${STOP:-0}" != 1 ]; then
    echo
    echo "The daemon keeps running: try \`$ST create\`, \`$ST ls\`, \`$ST shell SANDBOX\` (socket $SANDTREE_SOCKET)."
    echo "Stop it with: kill \$(pgrep -f 'sandtree daemon')"
fi
