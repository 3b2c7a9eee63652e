"""Hosts of their own on one machine, for the tests and the network benchmark (bench.net.links): a Linux bridge on the host side (the driver's
and the standalone Master's address) and one network namespace per cluster host, each joined to
the bridge by a veth pair, with an address of its own and a link shaped to a chosen rate (a token
bucket, ``tc tbf``, on both ends of the pair). Not delay: the kernels of these machines have no
``netem`` (``tc qdisc ... netem`` answers "unknown qdisc"), so a link's latency is the veth's own.

Everything is named after this process (``sdt<tag>br``, ``sdt<tag>h0``, ``sdt<tag>v0``) and in a
/24 that no route of the machine uses, and :meth:`HostNetwork.remove` deletes it by those names and
checks that nothing of it is left: the machine's own interfaces, routes and namespaces are never
touched. Needs root (``ip netns add``); :func:`unavailable` says why a machine cannot have it.

A link can be cut (its host-side end set down: every packet dropped both ways, no error to the
sockets on either side until their own timeouts, as a switch port that fails) and restored, or
slowed; its host-side interface counters are the
bytes that crossed it (``rx``: from the host, ``tx``: to it; host-to-host traffic crosses both hosts'
links).
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def unavailable() -> str | None:
    """Why this machine cannot create the tests' hosts (None: it can)."""
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "needs iproute2's ip and tc"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    probe = f"sdtprobe{os.getpid() % 100000}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


def _free_subnet() -> ipaddress.IPv4Network:
    used = []
    for line in _ip("-4", "route", "show", "table", "all").stdout.splitlines() + _ip("-4", "-o", "addr").stdout.split():
        for word in line.split():
            try:
                used.append(ipaddress.ip_network(word, strict=False))
            except ValueError:
                pass
    for k in range(256):
        net = ipaddress.ip_network(f"10.213.{(os.getpid() + k) % 256}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise RuntimeError("no free 10.213.x.0/24 for the test hosts")


@dataclass
class Link:
    rate: str = "1gbit"  # tc's units: 1gbit, 100mbit, 10mbit
    burst: str = "256kb"  # what the bucket lets through at once: at least rate / 1000 s at 1 Gb/s
    queue: str = "20ms"  # packets waiting longer than this are dropped, as a switch's buffer would

    def qdisc(self) -> list[str]:
        return ["tbf", "rate", self.rate, "burst", self.burst, "latency", self.queue]


@dataclass
class HostNetwork:
    hosts: int = 2
    link: Link = field(default_factory=Link)
    tag: str = ""
    subnet: ipaddress.IPv4Network | None = None
    made: list[str] = field(default_factory=list)  # "netns NAME" / "link NAME", in creation order

    def __post_init__(self) -> None:
        self.tag = self.tag or f"{os.getpid() % 100000}"

    @property
    def bridge(self) -> str:
        return f"sdt{self.tag}br"

    def namespace(self, i: int) -> str:
        return f"sdt{self.tag}h{i}"

    def veth(self, i: int) -> str:
        """The host-side end of host ``i``'s link (its counters are the link's)."""
        return f"sdt{self.tag}v{i}"

    @property
    def driver_address(self) -> str:
        """The host side's address on the bridge: the driver and the Master bind it."""
        return str(self.subnet.network_address + 1)

    def address(self, i: int) -> str:
        return str(self.subnet.network_address + 11 + i)

    @property
    def addresses(self) -> list[str]:
        return [self.address(i) for i in range(self.hosts)]

    def describe(self) -> dict:
        """What another process needs to act on this network (:meth:`attach`)."""
        return {"hosts": self.hosts, "tag": self.tag, "subnet": str(self.subnet), "rate": self.link.rate, "burst": self.link.burst}

    @classmethod
    def attach(cls, described: dict) -> "HostNetwork":
        """This network in another process (a job the test submitted): shape, cut, count; it removes
        nothing (the process that created it does)."""
        return cls(hosts=described["hosts"], link=Link(rate=described["rate"], burst=described["burst"]), tag=described["tag"],
                   subnet=ipaddress.ip_network(described["subnet"]))

    def create(self) -> "HostNetwork":
        atexit.register(self.remove)
        self.subnet = _free_subnet()
        prefix = self.subnet.prefixlen
        _ip("link", "add", self.bridge, "type", "bridge")
        self.made.append(f"link {self.bridge}")
        _ip("addr", "add", f"{self.driver_address}/{prefix}", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for i in range(self.hosts):
            ns, veth, peer = self.namespace(i), self.veth(i), f"sdt{self.tag}p{i}"
            _ip("netns", "add", ns)
            self.made.append(f"netns {ns}")
            _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
            self.made.append(f"link {veth}")
            _ip("link", "set", peer, "netns", ns)
            _ip("-n", ns, "link", "set", peer, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{self.address(i)}/{prefix}", "dev", "eth0")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("link", "set", veth, "master", self.bridge)
            _ip("link", "set", veth, "up")
            self.shape(i, self.link)
        return self

    def shape(self, i: int, link: Link) -> None:
        """Host ``i``'s link at ``link``'s rate, both ways."""
        for cmd, dev in ((["tc"], self.veth(i)), ([*self.exec_prefix(i), "tc"], "eth0")):
            subprocess.run([*cmd, "qdisc", "replace", "dev", dev, "root", *link.qdisc()], check=True, capture_output=True, timeout=30)

    def cut(self, i: int) -> None:
        """Host ``i``'s link drops every packet, both ways."""
        _ip("link", "set", self.veth(i), "down")

    def restore(self, i: int) -> None:
        _ip("link", "set", self.veth(i), "up")

    def restore_shape(self, i: int) -> None:
        """Host ``i``'s link back at the network's own rate."""
        self.shape(i, self.link)

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes each host's link carried so far: ``{address: {"rx": from it, "tx": to it}}``."""
        out = {}
        for i in range(self.hosts):
            stats = f"/sys/class/net/{self.veth(i)}/statistics"
            with open(f"{stats}/rx_bytes") as rx, open(f"{stats}/tx_bytes") as tx:
                out[self.address(i)] = {"rx": int(rx.read()), "tx": int(tx.read())}
        return out

    FIREWALL = "sdt_fw"  # the nftables table each host's firewall lives in

    def allow_only(self, driver_ports: list[str], host_ports: list[str]) -> None:
        """A firewall on every host: a new TCP connection from it to the driver's address is let through
        only to ``driver_ports``, to another host only to ``host_ports`` (numbers, or ``LOW-HIGH``
        ranges), any other is refused at once (a TCP reset, counted: :meth:`refused`). Connections
        within a host (loopback, its own address) and replies are not filtered."""
        rules = f"""table inet {self.FIREWALL} {{
  chain out {{
    type filter hook output priority 0; policy accept;
    oif "lo" accept
    ip daddr {self.driver_address} tcp dport {{ {", ".join(driver_ports)} }} accept
    ip daddr {self.subnet} ip daddr != {self.driver_address} tcp dport {{ {", ".join(host_ports)} }} accept
    ip daddr {self.subnet} tcp flags & (syn | ack) == syn counter reject with tcp reset
  }}
}}
"""
        for i in range(self.hosts):
            subprocess.run([*self.exec_prefix(i), "nft", "-f", "-"], input=rules, text=True, check=True, capture_output=True, timeout=30)

    def refused(self) -> dict[str, int]:
        """Connections each host's firewall refused so far (``{}`` without one)."""
        out = {}
        for i in range(self.hosts):
            proc = subprocess.run([*self.exec_prefix(i), "nft", "list", "table", "inet", self.FIREWALL],
                                  capture_output=True, text=True, timeout=30)
            if proc.returncode == 0:
                out[self.address(i)] = sum(int(w.split()[0]) for w in proc.stdout.split("counter packets ")[1:])
        return out

    def open_all(self) -> None:
        """Remove every host's firewall."""
        for i in range(self.hosts):
            subprocess.run([*self.exec_prefix(i), "nft", "delete", "table", "inet", self.FIREWALL], capture_output=True, timeout=30)

    def exec_prefix(self, i: int) -> list[str]:
        """The command prefix that runs a program on host ``i``."""
        return ["ip", "netns", "exec", self.namespace(i)]

    def leftovers(self) -> list[str]:
        """What of this network still exists (empty once removed)."""
        names = set(_ip("netns", "list", check=False).stdout.split())
        links = {line.split(":")[1].strip().split("@")[0] for line in _ip("-o", "link", check=False).stdout.splitlines()}
        return sorted(n for n in names | links if n.startswith(f"sdt{self.tag}"))

    def remove(self) -> list[str]:
        """Delete the namespaces (their veth ends go with them) and the bridge, by name; returns what
        was left before (the caller asserts it is then gone: :meth:`leftovers`)."""
        for entry in reversed(self.made):
            kind, name = entry.split(" ", 1)
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            else:
                _ip("link", "del", name, check=False)
        removed, self.made = self.made, []
        return removed
