#!/usr/bin/env bash
# README command two: every check and every test. Run as root on Linux with
# btrfs, overlayfs, user namespaces and cgroups (see README "Requirements").
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mkfs.btrfs >/dev/null; then
    echo "installing btrfs-progs (mkfs.btrfs)"; apt-get update -qq && apt-get install -y -qq btrfs-progs >/dev/null
fi
# (Sandboxes' networks: routers' rules are nftables scripts.)
if ! command -v nft >/dev/null && [ ! -x /usr/sbin/nft ]; then
    echo "installing nftables"; apt-get update -qq && apt-get install -y -qq nftables >/dev/null
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
# (An X server and two X clients, from Debian: a desktop of a computer-use
# agent, whose clients connect through the abstract namespace.)
if ! command -v Xvfb >/dev/null || ! command -v xprop >/dev/null; then
    echo "installing xvfb and x11-utils"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends xvfb x11-utils >/dev/null
fi
# (A Jupyter kernel and its client, from PyPI, for the python3 sandboxes
# run: the host's /usr/bin/python3.)
if ! /usr/bin/python3 -c 'import ipykernel, jupyter_client' 2>/dev/null; then
    echo "installing ipykernel and jupyter_client for /usr/bin/python3"
    /usr/bin/python3 -m pip --version >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq python3-pip >/dev/null; }
    /usr/bin/python3 -m pip install -q --break-system-packages 'ipykernel==7.4.0' 'jupyter_client==8.10.0'
fi
echo "== rustfmt"; cargo fmt --all -- --check
echo "== clippy"; cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== tests"; cargo test --workspace --locked -- --test-threads=2
# The Python SDK, the MCP server and the E2B door, driven by their official
# clients (pytest, the `mcp` and `e2b` packages) against a daemon of their own;
# the SDK is installed from ./python into a venv, as a user would install it.
echo "== python: the SDK, the MCP server, the E2B door"
if [ ! -x target/python/bin/pip ]; then
    rm -rf target/python
    if ! /usr/bin/python3 -m venv target/python >/dev/null 2>&1; then
        echo "installing python3-venv"; rm -rf target/python
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        /usr/bin/python3 -m venv target/python
    fi
fi
target/python/bin/pip install -q --disable-pip-version-check './python[test]'
cargo build --locked -p sandtree
(cd python && SANDTREE_BIN="$PWD/../target/debug/sandtree" ../target/python/bin/python -m pytest -q -p no:cacheprovider tests)
# The workload suite again, every rollback from the checkpoint's durable
# process image (its templates dropped first): each case restores exactly
# or is refused by name (docs/architecture/durable-images.md).
echo "== workloads from the durable images"
SANDTREE_WORKLOADS_FROM_IMAGES=1 cargo test -p sandtree-runtime --locked --test workloads -- --test-threads=2
