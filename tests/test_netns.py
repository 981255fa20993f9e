"""The namespace harness itself (tests/netns.py): hosts reach each other by address and nothing
else, and every namespace is gone after the block, an exception inside it included."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from tests.locust_runs import REPO
from tests.netns import NetnsUnavailable, Network, hosts, namespaces_now, wait_for

# a TCP echo of one line: listens on argv[1]:argv[2], prints "listening", answers one client
SERVER = (
    "import socket,sys\n"
    "s=socket.create_server((sys.argv[1],int(sys.argv[2])))\n"
    "print('listening',flush=True)\n"
    "c,peer=s.accept(); c.sendall(b'hello from '+peer[0].encode()); c.close()\n"
)
# connects to argv[1]:argv[2]; prints what it got, or the error's strerror (exit 3)
CLIENT = (
    "import socket,sys\n"
    "try:\n"
    "  s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3); print(s.recv(100).decode())\n"
    "except OSError as e:\n"
    "  print(e.strerror or e); sys.exit(3)\n"
)


def _connect(net: Network, host: str, address: str, port: int) -> subprocess.CompletedProcess[str]:
    """A TCP connection from `host` to address:port: what the server said, or why it failed (exit 3)."""
    return net.run(host, [sys.executable, "-c", CLIENT, address, str(port)], capture_output=True, text=True, timeout=10)


def test_hosts_reach_each_other_by_address_and_nothing_outside() -> None:
    # a service in the root namespace, on its loopback: a host must not see it
    outside = socket.create_server(("127.0.0.1", 0))
    outside_port = outside.getsockname()[1]
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(outside.accept()), daemon=True).start()
    try:
        with hosts("a", "b") as net:
            assert net.address("a") != net.address("b")
            server = net.popen(
                "b", [sys.executable, "-c", SERVER, "0.0.0.0", "7000"], stdout=subprocess.PIPE, text=True
            )
            assert server.stdout is not None and server.stdout.readline().strip() == "listening"
            reached = _connect(net, "a", net.address("b"), 7000)
            assert reached.returncode == 0, reached.stdout + reached.stderr
            # b saw the connection come from a's address: they met on the bridge, not a loopback
            assert reached.stdout.strip() == f"hello from {net.address('a')}"

            # no route out: an Internet address, and the root namespace's own addresses
            internet = _connect(net, "a", "1.1.1.1", 80)
            assert internet.returncode == 3 and "Network is unreachable" in internet.stdout, internet.stdout
            loopback = _connect(net, "a", "127.0.0.1", outside_port)
            assert loopback.returncode == 3 and "Connection refused" in loopback.stdout, loopback.stdout
            routes = net.run("a", ["ip", "route", "show", "default"], capture_output=True, text=True)
            assert routes.returncode == 0 and routes.stdout.strip() == ""
            # the root namespace holds no end of the test's links
            root_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
            assert net.prefix not in root_links and "br0" not in root_links.split()
    finally:
        outside.close()
    assert not accepted  # the root namespace's service never saw a connection


def test_namespaces_and_processes_are_gone_after_the_block_and_after_an_exception() -> None:
    with hosts("a", "b") as net:
        made = {net.namespace("a"), net.namespace("b"), f"{net.prefix}-switch"}
        assert made <= namespaces_now()
        sleeper = net.popen("a", [sys.executable, "-c", "import time; time.sleep(600)"])
    assert not made & namespaces_now()
    assert sleeper.poll() is not None

    with pytest.raises(ZeroDivisionError), hosts("a", grace_s=0.5) as net:
        made = {net.namespace("a"), f"{net.prefix}-switch"}
        # ignores SIGTERM: teardown must go on to SIGKILL
        stubborn = net.popen(
            "a", [sys.executable, "-c", "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                  "print('ready', flush=True); time.sleep(600)"], stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert stubborn.stdout is not None and stubborn.stdout.readline().strip() == "ready"
        1 / 0  # noqa: B018
    assert not made & namespaces_now()
    assert stubborn.returncode == -9


def test_without_root_the_harness_fails_and_says_why() -> None:
    """Unprivileged, `ip netns add` is refused: an error naming root / CAP_SYS_ADMIN, never a skip."""
    if os.geteuid() != 0:
        with pytest.raises(NetnsUnavailable, match="root or CAP_SYS_ADMIN"), hosts("a"):
            pass
        return
    code = "from tests.netns import hosts\nwith hosts('a'): pass\n"
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"]
    proc = subprocess.run(
        [*nobody, sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert proc.returncode != 0
    assert "NetnsUnavailable" in proc.stderr and "root or CAP_SYS_ADMIN" in proc.stderr, proc.stderr[-2000:]


def test_wait_for_names_what_never_happened() -> None:
    with pytest.raises(TimeoutError, match=r"the moon within 0\.1 s"):
        wait_for(lambda: False, 0.1, "the moon")
