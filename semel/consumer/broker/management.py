"""What the broker's management API says of semel's queues, including what AMQP cannot see.

A quorum queue that dead-letters at-least-once keeps each dead-lettered
message until the target queue confirmed it; the management API counts those
as ``messages_dlx``. They are in no ready or unacknowledged count, no consumer
can take them, and after leader changes close together the broker may hold
them for minutes or longer. semel no longer dead-letters through the broker,
but ``Q`` (its delivery limit) and delay queues declared by an earlier semel
still can.

Plain ``urllib`` (no HTTP client among the dependencies); callers in an event
loop run it in a thread.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

MANAGEMENT_PORT = 15672  # the management plugin's default
MANAGEMENT_TIMEOUT = 10.0  # seconds for one HTTP request


class ManagementError(Exception):
    """The management API could not be asked, or did not answer as expected."""


@dataclass(frozen=True, slots=True)
class QueueState:
    name: str
    exists: bool
    ready: int = 0
    unacknowledged: int = 0
    held_for_dead_lettering: int = 0  # messages_dlx: only quorum queues have it


def management_url_of(amqp_url: str) -> str:
    """The management API on the host of ``amqp_url``, on the plugin's default port,
    with the same credentials and virtual host."""
    parts = urllib.parse.urlsplit(amqp_url)
    scheme = "https" if parts.scheme == "amqps" else "http"
    userinfo = parts.netloc.rpartition("@")[0] if "@" in parts.netloc else "guest:guest"
    host = parts.hostname or "localhost"
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    vhost = parts.path[1:] if len(parts.path) > 1 else ""
    return f"{scheme}://{userinfo}@{host}:{MANAGEMENT_PORT}/{vhost}"


def queue_states(management_url: str, queues: list[str]) -> list[QueueState]:
    """The state of each of ``queues`` in the URL's virtual host (``/`` when the path is empty)."""
    parts = urllib.parse.urlsplit(management_url)
    if parts.scheme not in ("http", "https"):
        raise ManagementError(f"management URL must be http(s), not {parts.scheme!r}")
    vhost = urllib.parse.unquote(parts.path[1:]) if len(parts.path) > 1 else "/"
    base = f"{parts.scheme}://{parts.hostname}"
    if parts.port:
        base += f":{parts.port}"
    credentials = f"{urllib.parse.unquote(parts.username or 'guest')}:" + urllib.parse.unquote(
        parts.password or "guest"
    )
    authorization = "Basic " + base64.b64encode(credentials.encode()).decode()
    states = []
    for name in queues:
        path = "/api/queues/" + "/".join(urllib.parse.quote(p, safe="") for p in (vhost, name))
        body = _get(base + path, authorization)
        if body is None:
            states.append(QueueState(name, exists=False))
            continue
        states.append(
            QueueState(
                name,
                exists=True,
                ready=_count(body, "messages_ready"),
                unacknowledged=_count(body, "messages_unacknowledged"),
                held_for_dead_lettering=_count(body, "messages_dlx"),
            )
        )
    return states


def _count(body: dict[str, Any], field: str) -> int:
    value = body.get(field)
    return value if isinstance(value, int) else 0


def _get(url: str, authorization: str) -> dict[str, Any] | None:
    """The JSON object at ``url``; ``None`` for a 404 (no such queue)."""
    # Only http(s): queue_states checked the scheme.
    request = urllib.request.Request(url, headers={"Authorization": authorization})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=MANAGEMENT_TIMEOUT) as response:  # noqa: S310
            body = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise ManagementError(f"management API answered {exc.code} for {exc.url}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ManagementError(f"management API not reachable: {exc}") from None
    if not isinstance(body, dict):
        raise ManagementError("management API answered something other than a queue")
    return body
