#!/usr/bin/env bash
# README command two: every check and every test. Run as root on Linux with
# btrfs, overlayfs, user namespaces and cgroups (see README "Requirements").
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mkfs.btrfs >/dev/null; then
    echo "installing btrfs-progs (mkfs.btrfs)"; apt-get update -qq && apt-get install -y -qq btrfs-progs >/dev/null
fi
# (The workload tests run make and ps in sandboxes, which see the host's /usr.)
if ! command -v make >/dev/null || ! command -v ps >/dev/null; then
    echo "installing make and procps"; apt-get update -qq && apt-get install -y -qq make procps >/dev/null
fi
# (Real programs of the workload tests: redis-server from Debian; Node.js
# is in the host userland, installed from Debian where it is missing.)
if ! command -v redis-server >/dev/null || ! command -v node >/dev/null; then
    echo "installing redis-server and nodejs"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server nodejs >/dev/null
fi
echo "== rustfmt"; cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"; cargo test --workspace --locked -- --test-threads=2
