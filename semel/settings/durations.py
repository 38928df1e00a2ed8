"""A setting that is a span of time longer than seconds are handy for.

The other durations are plain seconds (``SEMEL_RETENTION=86400``); this type
takes those too, and also a number with a unit (``90m``, ``2h``, ``3d``,
``1w``, the forms ``semel dlq``'s ``--since`` takes) and ISO 8601 (``P14D``,
which is how :meth:`Settings.as_env` writes it back).
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

_WITH_UNIT = re.compile(r"(\d+(?:\.\d+)?)\s*([smhdw])", re.IGNORECASE)
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}
DURATION_FORMS = "seconds, or a number with a unit: 90m, 2h, 3d, 1w"


def _read(value: object) -> object:
    if not isinstance(value, str):
        return value
    text = value.strip()
    try:
        return timedelta(seconds=float(text))
    except ValueError:
        pass
    except OverflowError:
        raise ValueError(f"too long; give {DURATION_FORMS}") from None
    found = _WITH_UNIT.fullmatch(text)
    if found is not None:
        amount, unit = found.groups()
        try:
            return timedelta(**{_UNITS[unit.lower()]: float(amount)})
        except OverflowError:
            raise ValueError(f"too long; give {DURATION_FORMS}") from None
    if text[:1].upper() == "P":
        return text  # ISO 8601: pydantic reads it, or says what is wrong
    raise ValueError(f"give {DURATION_FORMS} (or ISO 8601: P14D)")


def _positive(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be longer than 0")
    return value


Duration = Annotated[timedelta, BeforeValidator(_read), AfterValidator(_positive)]

# RabbitMQ refuses a message whose expiration is much past ten years (3.10 takes
# 10 years and refuses 31, closing the channel), so a duration that becomes one
# is bounded here, where a bad value stops start-up.
MESSAGE_TTL_LIMIT = timedelta(days=3650)


def _within_message_ttl(value: timedelta) -> timedelta:
    if value > MESSAGE_TTL_LIMIT:
        raise ValueError("at most 3650d: the broker refuses a longer message expiration")
    return value


MessageTtl = Annotated[Duration, AfterValidator(_within_message_ttl)]
