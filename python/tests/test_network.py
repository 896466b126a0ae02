"""Sandboxes' networks through the SDK: the policy at create and on a
running sandbox, errors, and a port inside reached from the host.

(Traffic to the outside is tested against a peer of the test's own in
crates/sandtree/tests/e2e_network.rs; here nothing leaves the machine.)"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

import sandtree


def test_network_policy_at_create_and_on_a_running_sandbox(client: sandtree.Sandtree) -> None:
    with client.create(allow=["*.pypi.org"], deny=["0.0.0.0/0"]) as sb:
        n = sb.network()
        assert n.mode == "egress"
        assert n.allow == ("*.pypi.org",) and n.deny == ("0.0.0.0/0",)
        assert n.address == "10.0.2.15" and n.outward_address
        assert sb.info().network == n or sb.info().network.allow == n.allow
        n = sb.set_network(allow=["10.1.0.0/16"])
        assert n.allow == ("10.1.0.0/16",) and n.deny == ()
        with pytest.raises(sandtree.InvalidArgumentError, match="prefix length"):
            sb.set_network(deny=["10.0.0.0/40"])
        assert sb.network().allow == ("10.1.0.0/16",)
    with client.create(network="none") as alone:
        assert alone.network().mode == "none"
        assert "eth0" not in alone.exec("cat /proc/net/dev").stdout.decode()
        with pytest.raises(sandtree.InvalidArgumentError, match="no network"):
            alone.set_network(deny=["0.0.0.0/0"])
    with pytest.raises(sandtree.InvalidArgumentError, match="both allow and deny"):
        client.create(allow=["example.com"], deny=["example.com"])


def test_a_port_inside_is_reached_from_the_host(sandbox: sandtree.Sandbox) -> None:
    sandbox.spawn(["python3", "-m", "http.server", "8000", "--directory", "/etc"])
    sandbox.exec("for i in $(seq 50); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done")
    port = sandbox.expose(8000)
    assert port.address.startswith("127.0.0.1:")
    deadline = time.monotonic() + 10
    while True:
        try:
            with urllib.request.urlopen(port.url + "hostname", timeout=5) as r:
                assert r.read() == b"sandbox\n"
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    assert [p.port for p in sandbox.ports()] == [8000]
    sandbox.close_port(8000)
    assert sandbox.ports() == []


def test_async_network(socket_path: str) -> None:
    async def main() -> None:
        async with sandtree.AsyncSandtree(socket_path) as client:
            async with client.create(deny=["192.0.2.0/24"]) as sb:
                assert (await sb.network()).deny == ("192.0.2.0/24",)
                assert (await sb.set_network()).deny == ()
                assert (await sb.ports()) == []

    asyncio.run(main())
