"""A worker's network, made to fail on purpose: a network namespace joined to the host by a
veth pair, whose link the scenario takes down (a clean partition), black-holes (nftables drops
every packet, nothing is refused or reset) or flaps.

Needs root, ``ip`` (iproute2) and, for the black hole, ``nft``; ``NetworkNamespace.create``
raises ``Skip`` with the reason when any of it is missing, and ``skip_or_fail`` turns that into
a failure under ``CI=true``, where the test command installed them.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Sequence

from leaseq.testing.chaos.run import Skip


def skip_or_fail(reason: str) -> Exception:
    """A ``Skip`` for ``reason``; under ``CI=true`` the partition scenarios must run, so a
    ``RuntimeError`` (a failure) instead."""
    if os.environ.get("CI", "").lower() == "true":
        return RuntimeError(f"CI=true, and a partition scenario cannot run: {reason}")
    return Skip(reason)


class NetworkNamespace:
    """``lq-<hex>``: a namespace at ``10.231.N.2`` whose only way out is a veth pair to the
    host side at ``10.231.N.1``."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.name = f"lq-{tag}"
        self.host_if, self.inner_if = f"lqh{tag}", f"lqa{tag}"
        subnet = int(tag[:2], 16)
        self.host_ip, self.inner_ip = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
        self.made = False
        self.hole = False

    @classmethod
    def create(cls) -> NetworkNamespace:
        if os.geteuid() != 0:
            raise skip_or_fail("network namespaces need root")
        if shutil.which("ip") is None:
            raise skip_or_fail("`ip` (iproute2) is not installed")
        ns = cls()
        try:
            ns._make()
        except (subprocess.SubprocessError, OSError) as exc:
            ns.delete()
            raise skip_or_fail(f"cannot make a network namespace and veth pair: "
                               f"{_why(exc)}") from None
        return ns

    def _make(self) -> None:
        self.made = True
        _ip("netns", "add", self.name)
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.inner_if)
        _ip("link", "set", self.inner_if, "netns", self.name)
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        self.inside(["ip", "addr", "add", f"{self.inner_ip}/24", "dev", self.inner_if])
        self.inside(["ip", "link", "set", self.inner_if, "up"])
        self.inside(["ip", "link", "set", "lo", "up"])

    def prefix(self) -> list[str]:
        """What runs a command inside the namespace."""
        return ["ip", "netns", "exec", self.name]

    def inside(self, command: Sequence[str], stdin: str | None = None) -> None:
        subprocess.run([*self.prefix(), *command], check=True, capture_output=True,
                       input=stdin, text=True, timeout=30)

    def link(self, up: bool) -> None:
        """Take the host's end of the veth down (the namespace's carrier goes with it) or
        bring it back: a clean partition."""
        _ip("link", "set", self.host_if, "up" if up else "down")

    def black_hole(self, on: bool) -> None:
        """Drop every packet in and out of the namespace's veth, silently: the link stays up,
        nothing is refused or reset, a call simply never hears back."""
        if on:
            if shutil.which("nft") is None:
                raise skip_or_fail("`nft` (nftables) is not installed: scripts/test installs it")
            self.inside(["nft", "-f", "-"], stdin=_DROP_RULES.format(dev=self.inner_if))
        elif self.hole:
            self.inside(["nft", "delete", "table", "inet", "leaseq_chaos"])
        self.hole = on

    def delete(self) -> None:
        """Remove the namespace (its veth pair and rules go with it)."""
        if self.made:
            subprocess.run(["ip", "netns", "del", self.name], capture_output=True, timeout=30)
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True, timeout=30)
            self.made = False


_DROP_RULES = """
table inet leaseq_chaos {{
    chain in {{ type filter hook input priority -300; policy accept; iifname "{dev}" drop; }}
    chain out {{ type filter hook output priority -300; policy accept; oifname "{dev}" drop; }}
}}
"""


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{' '.join(map(str, exc.cmd[:6]))}: {(exc.stderr or '').strip()[:200]}"
    return str(exc)[:200]
