"""Handlers that fail the same way from a known line, for the error fingerprint tests.

Each one fails inside ``_gateway``, a helper of this module, in a call to the
standard library: the fingerprint must name the helper's line (the
application's innermost frame), not the line inside ``json`` that raised.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from semel.consumer import Context, PermanentError


def _gateway(body: dict[str, Any]) -> Any:
    if body.get("permanent"):
        raise PermanentError("card declined")  # line: permanent
    return json.loads(body["reply"])  # line: decode


async def charge_async(context: Context) -> Any:
    return _gateway(context.body)


def charge_plain(context: Context) -> Any:
    return _gateway(context.body)


@dataclass(frozen=True)
class Charge:
    reply: str = ""
    permanent: bool = False


async def charge_typed(charge: Charge) -> Any:
    """Called through semel's typed wrapper, whose class is semel's own."""
    return _gateway({"reply": charge.reply, "permanent": charge.permanent})
