"""Hosts of a test's own making on this machine: one network namespace each, joined by a bridge.

A distributed run on loopback proves little about addresses: every process can reach every other
at 127.0.0.1, so a worker that ignored --master-host or a master that handed out its own loopback
would still pass. Here each host has its own stack, reachable only by its address on a private
/24, and nothing can leave: the bridge lives in a "switch" namespace of its own (nothing is
attached to the root namespace) and no host has a default route.

    with hosts("master", "worker1", "target") as net:
        net.address("target")                      # "10.211.7.3"
        proc = net.popen("target", [sys.executable, "-m", "llmload.sim", ...])
        net.run("master", ["ip", "addr"])

Teardown always runs (an exception or Ctrl-C inside the block included): the processes started
here are stopped by PID (SIGTERM, then SIGKILL), then every namespace made here is deleted, which
removes its veth pair. Creating namespaces needs root (CAP_SYS_ADMIN); without it `hosts` raises
NetnsUnavailable, so a test fails and says why instead of skipping.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

SUBNET_PREFIX = "10.211"  # hosts get 10.211.X.2, .3, ...; X differs between test processes
_SEQUENCE = itertools.count()


class NetnsUnavailable(RuntimeError):
    """This machine or user cannot make network namespaces (not root, no CAP_SYS_ADMIN, no `ip`)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"`ip {' '.join(args)}` failed ({proc.returncode}): {proc.stderr.strip()}")


@dataclass
class Network:
    """The namespaces of one `hosts` block: a name per host, its address, the processes started in it."""

    prefix: str  # namespace names are PREFIX-HOST; the switch is PREFIX-switch
    subnet: str  # "10.211.X"
    names: list[str]
    grace_s: float = 5.0  # SIGTERM to SIGKILL at teardown
    namespaces: list[str] = field(default_factory=list)  # made so far, deleted at teardown
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def namespace(self, host: str) -> str:
        if host not in self.names:
            raise KeyError(f"no host {host!r} in this network (hosts: {', '.join(self.names)})")
        return f"{self.prefix}-{host}"

    def address(self, host: str) -> str:
        """The host's IPv4 address on the bridge (its only way in or out)."""
        self.namespace(host)  # an unknown host: KeyError
        return f"{self.subnet}.{self.names.index(host) + 2}"

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """`argv` run inside the host's namespace (`ip netns exec` execs it: the PID is argv's own)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start `argv` in the host; stopped at teardown. In a session of its own, so the terminal's
        Ctrl-C reaches only the test, whose teardown then stops it and whatever it started."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        kwargs.setdefault("start_new_session", True)
        proc = subprocess.Popen(self.command(host, argv), **kwargs)
        self.processes.append(proc)
        return proc

    def run(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[Any]:
        """Run `argv` in the host to its end (`subprocess.run` keyword arguments; `check` defaults to False)."""
        kwargs.setdefault("check", False)
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.run(self.command(host, argv), **kwargs)  # noqa: PLW1510

    def stop(self, proc: subprocess.Popen[Any], grace_s: float | None = None) -> None:
        """SIGTERM to a process started here (and its process group: what it started), SIGKILL
        after `grace_s`. Only PIDs this network started are ever signalled."""
        if proc not in self.processes:
            raise ValueError(f"pid {proc.pid} was not started by this network")
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, sig)  # start_new_session: the group's id is the PID started here
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)  # popen(start_new_session=False): the process alone
            try:
                proc.wait(self.grace_s if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                continue
        if proc.poll() is None:
            proc.wait()
        # a session leader's children may outlive it: end what is left of its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)

    def teardown(self) -> None:
        """Stop every process started here, then delete every namespace made here."""
        for proc in reversed(self.processes):
            with contextlib.suppress(Exception):
                self.stop(proc)
        errors = []
        for ns in reversed(self.namespaces):
            proc = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                errors.append(f"{ns}: {proc.stderr.strip()}")
        self.namespaces.clear()
        if errors:
            raise RuntimeError("could not delete network namespaces: " + "; ".join(errors))


def _subnet(sequence: int) -> str:
    """A /24 of its own for each network of each test process: the bridges are apart anyway, but a
    stray route or a leftover namespace then never meets another test's addresses."""
    return f"{SUBNET_PREFIX}.{(os.getpid() * 7 + sequence) % 250 + 1}"


def _create(net: Network) -> None:
    switch = f"{net.prefix}-switch"
    add = subprocess.run(["ip", "netns", "add", switch], capture_output=True, text=True, check=False)
    if add.returncode != 0:
        raise NetnsUnavailable(
            f"`ip netns add` was refused ({add.stderr.strip()}): the network-namespace tests need root or "
            f"CAP_SYS_ADMIN (uid {os.geteuid()})"
        )
    net.namespaces.append(switch)
    _ip("-n", switch, "link", "add", "br0", "type", "bridge")
    _ip("-n", switch, "link", "set", "br0", "up")
    for index, host in enumerate(net.names):
        ns = net.namespace(host)
        _ip("netns", "add", ns)
        net.namespaces.append(ns)
        # both ends made in their namespaces: the pair never exists in the root namespace
        _ip("-n", switch, "link", "add", f"p{index}", "type", "veth", "peer", "name", "eth0", "netns", ns)
        _ip("-n", switch, "link", "set", f"p{index}", "master", "br0")
        _ip("-n", switch, "link", "set", f"p{index}", "up")
        _ip("-n", ns, "addr", "add", f"{net.address(host)}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")


def _wait_reachable(net: Network, timeout_s: float = 5.0) -> None:
    """Until the bridge forwards (its ports leave the listening state): first host pings the others."""
    if len(net.names) < 2:
        return
    first = net.names[0]
    code = (
        "import socket,sys,time\n"
        "end=time.monotonic()+float(sys.argv[1])\n"
        "for a in sys.argv[2:]:\n"
        "  while True:\n"
        "    s=socket.socket(); s.settimeout(0.5)\n"
        "    try: s.connect((a,9)); break\n"
        "    except ConnectionRefusedError: break\n"
        "    except OSError:\n"
        "      if time.monotonic()>end: sys.exit('unreachable: '+a)\n"
        "      time.sleep(0.05)\n"
        "    finally: s.close()\n"
    )
    others = [net.address(h) for h in net.names[1:]]
    proc = net.run(first, [sys.executable, "-c", code, str(timeout_s), *others], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"hosts of the test network do not reach each other: {proc.stderr.strip()}")


@contextlib.contextmanager
def hosts(*names: str, grace_s: float = 5.0) -> Iterator[Network]:
    """Namespaces for `names` on one bridge, addresses SUBNET.2, .3, ... in that order (see the
    module); `grace_s` between SIGTERM and SIGKILL for each process still running at teardown."""
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"host names must be distinct and at least one: {names}")
    if "switch" in names:
        raise ValueError("'switch' names the bridge's own namespace")
    sequence = next(_SEQUENCE)
    net = Network(prefix=f"llt{os.getpid()}-{sequence}", subnet=_subnet(sequence), names=list(names), grace_s=grace_s)
    try:
        try:
            _create(net)
        except FileNotFoundError as exc:
            raise NetnsUnavailable(f"the `ip` command (iproute2) is missing: {exc}") from None
        _wait_reachable(net)
        yield net
    finally:
        net.teardown()


def namespaces_now() -> set[str]:
    """The names `ip netns list` shows (for checks that a network's namespaces are gone)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def wait_for(condition: Any, timeout_s: float, what: str) -> None:
    """Poll `condition()` until true; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        time.sleep(0.05)
