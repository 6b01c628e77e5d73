"""What a forwarder is told: addresses (``HOST:PORT``), the ``-L``/``-R``/``-D`` specs,
the far end's ``--allow`` rules, and the near end's reconnection backoff. Pure values and
parsers: every error is a ``ValueError`` naming the option, the text and what is wrong."""

from __future__ import annotations

import ipaddress
import random
import re
from dataclasses import dataclass
from typing import NamedTuple


__all__ = ["AllowList", "AllowRule", "Backoff", "Forward", "HostPort", "parse_host_port"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_HOST = re.compile(r"^[A-Za-z0-9_.\-]{1,253}$")
"""A host name as a target or a bind address may spell it (IP literals are checked apart)."""


class HostPort(NamedTuple):
    """A host (a name, an IPv4 or an IPv6 address, without brackets) and a port."""

    host: str
    """The host: a name or an address (an IPv6 address without brackets)."""
    port: int
    """The port (0 for a listener: any free port)."""

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


def _split(text: str) -> list[str]:
    """``text`` split at the colons outside brackets (``[::1]:22`` is two parts)."""
    parts: list[str] = []
    current = ""
    depth = 0
    for char in text:
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        if char == ":" and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return parts


def _host(text: str, what: str) -> str:
    """A host as written (``[::1]`` unbracketed), checked: an IP literal or a plausible name."""
    host = text[1:-1] if text.startswith("[") and text.endswith("]") else text
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        pass
    if not _HOST.match(host):
        raise ValueError(f"{what}: not a host name or an address: {text!r}")
    return host


def _port(text: str, what: str, *, zero: bool) -> int:
    if not text.isdigit() or not (0 if zero else 1) <= int(text) <= 65535:
        low = 0 if zero else 1
        raise ValueError(f"{what}: expected a port in {low}..65535, got {text!r}")
    return int(text)


def parse_host_port(text: str, what: str = "HOST:PORT", *, zero: bool = False) -> HostPort:
    """``HOST:PORT`` (an IPv6 host in brackets: ``[::1]:22``); ``zero`` allows port 0.

    Raises:
        ValueError: naming ``what`` and the text.
    """
    parts = _split(text.strip())
    if len(parts) != 2 or not parts[0]:
        raise ValueError(f"{what}: expected HOST:PORT (an IPv6 host in brackets), got {text!r}")
    return HostPort(_host(parts[0], what), _port(parts[1], what, zero=zero))


KINDS = {"L": "local", "R": "remote", "D": "socks"}
"""The three kinds of forward, by their option letter."""


@dataclass(frozen=True, slots=True)
class Forward:
    """One forward of a near end: ``-L``, ``-R`` or ``-D`` (see :meth:`parse`)."""

    kind: str
    """``"L"`` (a local listener, the far end connects), ``"R"`` (a listener on the far
    end, the near end connects) or ``"D"`` (a local SOCKS5 server)."""
    bind: HostPort
    """Where the listener listens (on the far end's host for ``-R``); port 0: any free
    port."""
    target: HostPort | None = None
    """Where each connection goes; ``None`` for ``-D`` and for a bare ``-L PORT`` (the far
    end's ``--to``)."""

    @classmethod
    def parse(cls, kind: str, spec: str) -> Forward:
        """``kind`` ``"L"``, ``"R"`` or ``"D"`` and its spec as ssh writes it:
        ``[BIND:]PORT:HOST:HOSTPORT`` (``-L``, ``-R``), ``[BIND:]PORT`` (``-D``, and a bare
        ``-L``). BIND defaults to 127.0.0.1; ``*`` means every address (0.0.0.0). IPv6
        addresses go in brackets.

        Raises:
            ValueError: naming the option and what is wrong.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown forward kind {kind!r}: expected L, R or D")
        what = f"-{kind} {spec}"
        parts = _split(spec.strip())
        target: HostPort | None = None
        if len(parts) >= 3 and kind != "D":
            target = HostPort(_host(parts[-2], what), _port(parts[-1], what, zero=False))
            parts = parts[:-2]
        if kind == "R" and target is None:
            raise ValueError(f"{what}: expected [BIND:]PORT:HOST:HOSTPORT (where the near end connects)")
        if len(parts) == 1:
            bind_host = "127.0.0.1"
        elif len(parts) == 2:
            if parts[0].isdigit():
                raise ValueError(f"{what}: {parts[0]!r} is not a bind address (a target needs HOST:HOSTPORT)")
            bind_host = "0.0.0.0" if parts[0] in ("*", "") else _host(parts[0], what)
        else:
            form = "[BIND:]PORT" if kind == "D" else "[BIND:]PORT[:HOST:HOSTPORT]"
            raise ValueError(f"{what}: expected {form}")
        return cls(kind, HostPort(bind_host, _port(parts[-1], what, zero=True)), target)

    def with_port(self, port: int) -> Forward:
        """This forward with the port its listener really got."""
        return Forward(self.kind, HostPort(self.bind.host, port), self.target)

    def describe(self) -> str:
        """``-L 127.0.0.1:8080 -> 10.0.0.5:80`` (what the ``listening`` lines say)."""
        if self.kind == "D":
            return f"-D {self.bind} (SOCKS5)"
        target = str(self.target) if self.target is not None else "the far end's --to"
        return f"-{self.kind} {self.bind} -> {target}"

    def __str__(self) -> str:
        return self.describe()


def _ports(text: str, what: str) -> tuple[int, int] | None:
    if text == "*":
        return None
    low, sep, high = text.partition("-")
    first = _port(low, what, zero=False)
    last = _port(high, what, zero=False) if sep else first
    if last < first:
        raise ValueError(f"{what}: the port range {text!r} is empty")
    return first, last


@dataclass(frozen=True, slots=True)
class AllowRule:
    """One ``--allow`` rule: which targets the far end may connect to (see :meth:`parse`)."""

    text: str
    """The rule as written."""
    name: str | None = None
    """A host name the request must name (lower case), or None."""
    network: IPNetwork | None = None
    """Addresses the target must resolve to (an address is a /32 or /128), or None."""
    ports: tuple[int, int] | None = None
    """The port range allowed (inclusive), or None for any port."""

    @classmethod
    def parse(cls, spec: str) -> AllowRule:
        """``*`` (anything), ``HOST:PORT``, ``HOST:*``, ``*:PORT``, an address or a CIDR
        with a port (``10.0.0.0/8:22``, ``[fd00::/8]:443``, ``[::1]:*``); a port may be a
        range (``8000-8099``). A name rule matches that name as the request names it (case
        aside); an address or CIDR rule matches the addresses the target resolves to, and
        the far end connects only to those.

        Raises:
            ValueError: naming the rule and what is wrong.
        """
        what = f"--allow {spec}"
        text = spec.strip()
        if text == "*":
            return cls(text)
        parts = _split(text)
        if len(parts) != 2 or not parts[0]:
            raise ValueError(f"{what}: expected *, HOST:PORT, HOST:*, *:PORT or CIDR:PORT")
        host, port = parts
        ports = _ports(port, what)
        if host == "*":
            return cls(text, ports=ports)
        bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
        if "/" in bare:
            try:
                network: IPNetwork = ipaddress.ip_network(bare, strict=True)
            except ValueError as exc:
                raise ValueError(f"{what}: not a CIDR network: {exc}") from None
            return cls(text, network=network, ports=ports)
        try:
            address = ipaddress.ip_address(bare)
        except ValueError:
            return cls(text, name=_host(host, what).lower().rstrip("."), ports=ports)
        return cls(text, network=ipaddress.ip_network(address), ports=ports)

    def port_ok(self, port: int) -> bool:
        """Whether ``port`` is in the rule's ports."""
        return self.ports is None or self.ports[0] <= port <= self.ports[1]

    @property
    def any_host(self) -> bool:
        """Whether the rule allows every host."""
        return self.name is None and self.network is None


@dataclass(frozen=True, slots=True)
class AllowList:
    """The far end's ``--allow`` rules: a target is allowed when one rule matches it. No
    rule allows nothing."""

    rules: tuple[AllowRule, ...] = ()
    """The rules, in the order given."""

    @classmethod
    def parse(cls, specs: list[str] | tuple[str, ...]) -> AllowList:
        """The rules of ``specs`` (:meth:`AllowRule.parse` each)."""
        return cls(tuple(AllowRule.parse(spec) for spec in specs))

    def __bool__(self) -> bool:
        return bool(self.rules)

    def by_name(self, host: str, port: int) -> bool:
        """Whether a rule allows ``host:port`` whatever ``host`` resolves to: a rule for
        any host, for that name, or (``host`` being an address) for a network holding it."""
        name = host.lower().rstrip(".")
        address = _address(host)
        for rule in self.rules:
            if not rule.port_ok(port):
                continue
            if rule.any_host or rule.name == name:
                return True
            if address is not None and rule.network is not None and address in rule.network:
                return True
        return False

    def needs_addresses(self, host: str, port: int) -> bool:
        """Whether rules for networks could allow ``host:port`` once it is resolved (the
        far end resolves a name only then: a refused name is never looked up)."""
        return _address(host) is None and any(
            rule.network is not None and rule.port_ok(port) for rule in self.rules
        )

    def by_address(self, address: str, port: int) -> bool:
        """Whether a network rule allows ``address:port`` (a resolved address)."""
        ip = _address(address)
        return ip is not None and any(
            rule.network is not None and rule.port_ok(port) and ip in rule.network for rule in self.rules
        )

    def __str__(self) -> str:
        return ", ".join(rule.text for rule in self.rules) or "nothing"


def _address(host: str) -> IPAddress | None:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped  # ::ffff:10.0.0.1 is 10.0.0.1 to the rules
    return address


@dataclass(frozen=True, slots=True)
class Backoff:
    """How a near end waits between attempts to reconnect: ``initial`` seconds, times
    ``factor`` per failed attempt, at most ``maximum``, each delay jittered down to half
    (so that many near ends cut at once do not come back at once)."""

    initial: float = 0.5
    """The first delay (seconds)."""
    maximum: float = 30.0
    """The cap (seconds)."""
    factor: float = 2.0
    """Growth per failed attempt."""

    def __post_init__(self) -> None:
        if not 0 < self.initial <= self.maximum:
            raise ValueError(f"Backoff: need 0 < initial <= maximum, got {self.initial} and {self.maximum}")
        if self.factor < 1:
            raise ValueError(f"Backoff: factor must be at least 1, got {self.factor}")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before attempt ``attempt`` (1 for the first retry)."""
        base = min(self.maximum, self.initial * self.factor ** max(0, min(attempt - 1, 64)))
        return base * (rng or random).uniform(0.5, 1.0)
