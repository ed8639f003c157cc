"""The network guard: where direct fetching may connect.

Internal destinations (loopback, private, link-local with the cloud metadata address,
multicast, reserved, and the IPv6 forms of them) are refused in the connection layer, an
httpcore network backend: each new connection resolves its host once, refuses it if any
address is internal, and connects to the address it checked. docs/web.md tells why and
how to loosen it (HERMES_WEB_ALLOW_PRIVATE, HERMES_WEB_ALLOW_HOSTS).
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio

from hermes_sandbox.tools.web.client import setting
from hermes_sandbox.tools.web.errors import NotConfiguredError, PageError

if TYPE_CHECKING:
    from collections.abc import Iterable

    import httpcore
    import httpx

ALLOW_PRIVATE_HINT = (
    "web_extract does not fetch loopback, private, link-local or other internal addresses "
    "unless the host running the tools sets HERMES_WEB_ALLOW_PRIVATE=1"
)


class DestinationRefused(PageError):
    """A connection for direct fetching would go to an internal address.

    Raised by the guarded network backend, before any connection is made; it passes
    through httpcore and httpx untouched, and DirectExtract.fetch words it for the model.
    """

    def __init__(self, host: str, address: str, kind: str) -> None:
        self.host = host
        self.address = address
        self.kind = kind
        super().__init__(f"refused: {self.reason}; {ALLOW_PRIVATE_HINT}")

    @property
    def reason(self) -> str:
        if _is_literal(self.host):
            return f"{self.host} is {self.kind}"
        return f"{self.host} resolves to {self.address}, {self.kind}"


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})
_METADATA_ADDRESSES = frozenset(
    {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def internal_address_kind(address: str) -> str | None:
    """What makes ``address`` internal ("a loopback address", ...), or None if it is public.

    An IPv6 address carrying an IPv4 one is judged by it: IPv4-mapped and NAT64 addresses
    by it alone (the connection ends there), 6to4 ones by it and by themselves.
    Anything that does not parse as an address is internal: the check fails closed.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "not an address that can be checked"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # the connection goes to the IPv4 address
            return internal_address_kind(str(ip.ipv4_mapped))
        if ip in _NAT64:  # a NAT64 gateway translates it to the IPv4 address
            return internal_address_kind(str(ipaddress.IPv4Address(int(ip) & 0xFFFF_FFFF)))
        if ip.sixtofour is not None:  # 6to4: judged by both
            kind = internal_address_kind(str(ip.sixtofour))
            if kind is not None:
                return kind
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_unspecified:
        return "the unspecified address (this host)"
    if ip in _METADATA_ADDRESSES:
        return "the cloud metadata address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private:
        return "a private address"
    if ip.is_reserved:
        return "a reserved address"
    if not ip.is_global:
        return "a non-public address"
    return None


@dataclass(frozen=True, slots=True)
class DestinationPolicy:
    """Where direct fetching may connect: public addresses, plus what the operator allows."""

    allow_private: bool = False
    allowed_hosts: frozenset[tuple[str, int]] = frozenset()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DestinationPolicy:
        """HERMES_WEB_ALLOW_PRIVATE and HERMES_WEB_ALLOW_HOSTS; NotConfiguredError if malformed."""
        environ = os.environ if environ is None else environ
        raw = setting(environ, "HERMES_WEB_ALLOW_PRIVATE").lower()
        if raw not in _TRUE | _FALSE:
            raise NotConfiguredError(f"HERMES_WEB_ALLOW_PRIVATE must be 1 or 0, got {raw!r}")
        hosts = set()
        for entry in setting(environ, "HERMES_WEB_ALLOW_HOSTS").split(","):
            entry = entry.strip()
            if not entry:
                continue
            parts = urlsplit(f"//{entry}")
            try:
                port = parts.port
            except ValueError:
                port = None
            if not parts.hostname or port is None or parts.netloc != entry or "@" in entry:
                raise NotConfiguredError(
                    f"HERMES_WEB_ALLOW_HOSTS takes comma-separated host:port pairs, got {entry!r}"
                )
            hosts.add((parts.hostname, port))
        return cls(raw in _TRUE, frozenset(hosts))

    def allows(self, host: str, port: int) -> bool:
        """Whether a connection to ``host`` (as the URL names it) skips the address check."""
        return self.allow_private or (host.lower(), port) in self.allowed_hosts


async def _resolve(host: str, port: int) -> list[str]:
    """The addresses ``host`` stands for, in the resolver's order of preference.

    An IP literal is itself; a numeric IPv4 spelling (2130706433, 0x7f.1, 127.1) is the
    address inet_aton reads it as, which is what getaddrinfo would answer, without asking
    any name server; anything else goes to getaddrinfo.
    """
    if _is_literal(host):
        return [host]
    try:
        return [socket.inet_ntoa(socket.inet_aton(host))]
    except OSError:
        pass
    infos = await anyio.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _GuardedBackend:
    """An httpcore network backend that connects only where the policy allows.

    httpcore calls connect_tcp with the URL's host for every new connection (the first
    hop, each redirect to a new origin, each reconnect). The host is resolved once, every
    address checked, and the connection made to a checked address: there is no second
    lookup for a rebinding name server to answer differently. TLS is started on the
    returned stream by httpcore with the URL's host as server name (SNI and certificate
    check), and httpx sends the URL's Host header, so connecting by address changes
    neither.
    """

    def __init__(self, policy: DestinationPolicy) -> None:
        import httpcore

        self._policy = policy
        self._inner = httpcore.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        import httpcore

        try:
            with anyio.fail_after(timeout):
                addresses = await _resolve(host, port)
        except TimeoutError:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out") from None
        except OSError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        if not addresses:
            raise httpcore.ConnectError(f"{host} resolves to no address")
        if not self._policy.allows(host, port):
            for address in addresses:
                kind = internal_address_kind(address)
                if kind is not None:
                    raise DestinationRefused(host, address, kind)
        failure: httpcore.ConnectError | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(
                    address,
                    port,
                    timeout=timeout,
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise NotImplementedError("direct fetching connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_transport(policy: DestinationPolicy) -> httpx.AsyncHTTPTransport:
    """httpx's transport with its connection pool on the guarded backend.

    httpx 0.28 has no parameter for an httpcore network backend (encode/httpx#3749 would
    add one), so the pool is built here as httpx builds its default one, and put in the
    transport's place for it. If a later httpx keeps its pool elsewhere this raises
    rather than fetch unguarded.
    """
    import httpcore
    import httpx

    transport = httpx.AsyncHTTPTransport()
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError("this httpx keeps no connection pool in AsyncHTTPTransport._pool")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        max_connections=100,  # httpx's default limits
        max_keepalive_connections=20,
        keepalive_expiry=5.0,
        network_backend=_GuardedBackend(policy),  # type: ignore[arg-type]
    )
    return transport
