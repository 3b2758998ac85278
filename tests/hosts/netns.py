"""Hosts on one machine: a Linux network namespace per host, each with one veth link (``eth0``,
an address of one private /24) to a bridge that lives in a namespace of its own (the switch),
never in the machine's own namespace, so that the addresses exist only in the namespaces made
here and nothing is routed anywhere else. A link between two hosts is cut silently through
their neighbour tables (this machine's kernel has no ``sch_netem``, no ``tc`` actions and no
netfilter: see ``tests/hosts/link.py`` for delay and loss).

Every namespace is named ``PREFIX<pid>-<host>`` after the process that made it: ``sweep``
removes those whose process is gone (a test run killed by SIGKILL), with every process still
inside them."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "rlhosts-"
SUBNET = "10.213.38"  # a /24 that exists only inside the switch's bridge
NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000
# A locally administered hardware address that no host here has: frames sent to it are lost.
NOWHERE = "02:00:00:00:38:00"


class NamespacesUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, or no ``ip``)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def in_ns(ns: str, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` inside namespace ``ns`` and wait for it."""
    return _ip("netns", "exec", ns, *argv, check=check)


def why_unavailable() -> str | None:
    """None when this process can make namespaces, else why not."""
    if os.geteuid() != 0:
        return f"network namespaces need root (this process runs as uid {os.geteuid()})"
    if subprocess.run(["which", "ip"], capture_output=True, check=False).returncode:
        return "the `ip` command (iproute2) is missing"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def pids_in(ns: str) -> list[int]:
    """The processes inside namespace ``ns``."""
    done = _ip("netns", "pids", ns, check=False)
    return [int(p) for p in done.stdout.split()] if done.returncode == 0 else []


def kill_all_in(ns: str) -> list[int]:
    """SIGKILL every process inside ``ns`` at once (the host loses power); wait until gone."""
    victims = pids_in(ns)
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pids_in(ns) and time.monotonic() < deadline:
        time.sleep(0.05)
    return victims


def _owner_alive(name: str) -> bool:
    pid = name.removeprefix(PREFIX).split("-", 1)[0]
    return pid.isdigit() and Path(f"/proc/{pid}").exists()


def sweep() -> list[str]:
    """Delete the namespaces of this harness whose making process is gone, with what runs
    inside them; return their names."""
    if not NETNS_DIR.is_dir():
        return []
    gone = [p.name for p in NETNS_DIR.iterdir()
            if p.name.startswith(PREFIX) and not _owner_alive(p.name)]
    for name in gone:
        kill_all_in(name)
        _ip("netns", "del", name, check=False)
    return gone


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """Run the calling thread inside namespace ``ns`` (sockets it opens meanwhile belong to
    that namespace and keep working there afterwards); back to its own on exit."""
    libc = ctypes.CDLL(None, use_errno=True)
    home = os.open(f"/proc/self/task/{threading.get_native_id()}/ns/net", os.O_RDONLY)
    target = os.open(NETNS_DIR / ns, os.O_RDONLY)
    try:
        if libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {ns}")
        try:
            yield
        finally:
            if libc.setns(home, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns back home")
    finally:
        os.close(target)
        os.close(home)


@dataclass
class Network:
    """The switch and the hosts attached to it; ``destroy`` removes them all."""

    tag: str = field(default_factory=lambda: f"{PREFIX}{os.getpid()}")
    hosts: dict[str, str] = field(default_factory=dict)  # name -> address
    cuts: set[tuple[str, str]] = field(default_factory=set)  # (from, to) silenced

    @property
    def switch(self) -> str:
        return f"{self.tag}-switch"

    def ns(self, host: str) -> str:
        return f"{self.tag}-{host}"

    def create(self) -> Network:
        _ip("netns", "add", self.switch)
        in_ns(self.switch, "ip", "link", "add", "br0", "type", "bridge")
        in_ns(self.switch, "ip", "link", "set", "br0", "up")
        return self

    def add_host(self, host: str, octet: int) -> str:
        """A namespace for ``host`` with address SUBNET.octet on eth0, linked to the bridge."""
        ns, address = self.ns(host), f"{SUBNET}.{octet}"
        _ip("netns", "add", ns)
        self.hosts[host] = address
        # Both ends are made directly in their namespaces: no name is ever taken in the
        # machine's own namespace.
        _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"p-{host}",
            "netns", self.switch)
        in_ns(self.switch, "ip", "link", "set", f"p-{host}", "master", "br0", "up")
        in_ns(ns, "ip", "link", "set", "lo", "up")
        in_ns(ns, "ip", "addr", "add", f"{address}/24", "dev", "eth0")
        in_ns(ns, "ip", "link", "set", "eth0", "up")
        return address

    def cut(self, a: str, b: str) -> None:
        """Partition ``a`` from ``b``, both ways, silently: each one's neighbour entry for the
        other names a hardware address no host has, so their frames go nowhere and nothing
        answers (no reset, no ICMP), as with a cable pulled between them; everything else
        still reaches both."""
        for source, target in ((a, b), (b, a)):
            in_ns(self.ns(source), "ip", "neigh", "replace", self.hosts[target], "lladdr",
                  NOWHERE, "dev", "eth0", "nud", "permanent")
            self.cuts.add((source, target))

    def heal(self, a: str, b: str) -> None:
        """Undo ``cut``: the neighbour entries go, and ARP finds the real hosts again."""
        for source, target in ((a, b), (b, a)):
            in_ns(self.ns(source), "ip", "neigh", "del", self.hosts[target], "dev", "eth0",
                  check=False)
            self.cuts.discard((source, target))

    def destroy(self) -> None:
        """Kill every process inside the hosts, delete them and the switch (their veth ends
        go with them)."""
        for host in list(self.hosts):
            kill_all_in(self.ns(host))
            _ip("netns", "del", self.ns(host), check=False)
        kill_all_in(self.switch)
        _ip("netns", "del", self.switch, check=False)
        self.hosts.clear()
