"""Which Redis a URL names: one server, a primary found through Sentinel, or a Cluster.

::

    redis://[user:pass@]host:6379/0             one server (rediss:// for TLS, unix:// too)
    redis+sentinel://[user:pass@]s1:26379,s2:26379/<service>[/<db>]
    redis+cluster://[user:pass@]n1:6379,n2:6379[/0]

``rediss+sentinel://`` and ``rediss+cluster://`` speak TLS to every server.
The credentials are the data servers' (those holding the keys); sentinels
that require a password of their own get it as ``?sentinel_password=``
(and ``sentinel_username=``). Other query options (``ssl_ca_certs``,
``ssl_cert_reqs``...) apply to every data server, as on a plain URL.

Errors never repeat the URL: it may carry a password.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit

SENTINEL_PORT = 26379
REDIS_PORT = 6379
_SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")

Address = tuple[str, int]


class Mode(StrEnum):
    """How semel finds the server holding a key."""

    STANDALONE = "standalone"
    SENTINEL = "sentinel"
    CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed Redis URL. ``hosts`` are the sentinels or the cluster's seed nodes."""

    mode: Mode
    # Standalone: the URL as given; else a data server's URL up to its host. Never
    # in a repr: it may carry a password, as may sentinel_auth.
    url: str = field(repr=False)
    hosts: tuple[Address, ...] = ()
    url_tail: str = ""  # after a data server's host: the database and the options
    service: str = ""
    tls: bool = False
    sentinel_auth: dict[str, str] = field(default_factory=dict, repr=False)

    def node_url(self, address: Address) -> str:
        """The plain ``redis://`` URL of one data server: the URL's credentials, db and options."""
        host, port = address
        netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        return f"{self.url}{netloc}{self.url_tail}"


def _split(url: str) -> tuple[SplitResult, str]:
    """The URL's parts, and its network location taken apart by hand.

    Several hosts with an IPv6 one among them (``n1:7000,[::1]:7001``) are
    refused by ``urlsplit`` on some Python 3.11 releases (3.11.2, Debian
    12's) and taken by others, so the hosts never go through it.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ValueError("not a parsable URL")
    ends = [i for i in (rest.find(c) for c in "/?#") if i >= 0]
    end = min(ends, default=len(rest))
    try:
        parts = urlsplit(f"{scheme}://host{rest[end:]}")
    except ValueError:
        raise ValueError("not a parsable URL") from None
    return parts, rest[:end]


def parse(url: str) -> RedisTarget:
    """The Redis ``url`` names; :class:`ValueError` saying what is wrong, without the URL."""
    parts, netloc = _split(url)
    scheme, _, mode = parts.scheme.partition("+")
    if scheme not in ("redis", "rediss", "unix") or mode not in ("", "sentinel", "cluster"):
        raise ValueError(
            "scheme must be redis://, rediss://, unix://, redis+sentinel://, "
            "rediss+sentinel://, redis+cluster:// or rediss+cluster://"
        )
    if scheme == "unix" and mode:
        raise ValueError(f"a {mode} is reached over TCP: redis+{mode}:// or rediss+{mode}://")
    if not mode:
        return _standalone(url)
    userinfo, _, netloc = netloc.rpartition("@")
    default_port = SENTINEL_PORT if mode == "sentinel" else REDIS_PORT
    hosts = tuple(_address(h, default_port) for h in netloc.split(","))
    options = parse_qsl(parts.query, keep_blank_values=True)
    kept = urlencode([(k, v) for k, v in options if k not in _SENTINEL_OPTIONS])
    auth = {k: v for k, v in options if k in _SENTINEL_OPTIONS}
    at = f"{userinfo}@" if userinfo else ""
    if mode == "cluster":
        if parts.path.strip("/") not in ("", "0"):
            raise ValueError("a Redis Cluster has only database 0")
        if auth:
            raise ValueError("sentinel_* options belong to redis+sentinel:// URLs")
        tail = "/0" + (f"?{kept}" if kept else "")
        return RedisTarget(Mode.CLUSTER, f"{scheme}://{at}", hosts, tail, tls=scheme == "rediss")
    service, _, db = parts.path.strip("/").partition("/")
    if not service:
        raise ValueError("name the monitored primary: redis+sentinel://host:26379/<service>[/<db>]")
    if db and not db.isdigit():
        raise ValueError("the database after the service name must be a number")
    tail = f"/{db or 0}" + (f"?{kept}" if kept else "")
    return RedisTarget(
        Mode.SENTINEL, f"{scheme}://{at}", hosts, tail, service, scheme == "rediss", auth
    )


def _standalone(url: str) -> RedisTarget:
    parts = urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError("not a parsable URL") from None
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("URL has no host")
    return RedisTarget(Mode.STANDALONE, url, tls=parts.scheme == "rediss")


def _address(text: str, default_port: int) -> Address:
    try:
        parts = urlsplit(f"//{text}")
        port = parts.port
    except ValueError:
        raise ValueError("a host of the URL has a bad port") from None
    if not parts.hostname or parts.username is not None:
        raise ValueError("every host of the URL needs a name: host[:port],host[:port]")
    return parts.hostname, port or default_port
