"""The hostile rail: read the live config, pick a fault, book transfers. Never deduplicates.

Steps for one POST /submit (the view runs them in this order):
1. `load_config()` — the single config row, read per request so rates change while running.
2. sleep `latency_ms`.
3. `choose_fault(config)` — declined / 5xx / drop before booking / drop after booking / ok.
4. `record_call(...)`: the request log row and, for ok and drop-after, the booking (plus a
   second one on a duplicate ack), in one statement.
"""

from __future__ import annotations

import enum
import random
import secrets
import threading
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from dlock.dbrouter import alias_for
from dlock.prepared import prepared_cursor
from dlock.timefmt import utcnow
from railstub.models import RailstubConfig, RailTransfer


class Fault(enum.StrEnum):
    OK = "ok"
    DECLINED = "declined"
    ERROR_5XX = "error_5xx"
    DROP_BEFORE_BOOKING = "drop_before_booking"
    DROP_AFTER_BOOKING = "drop_after_booking"


@dataclass(frozen=True)
class Decision:
    fault: Fault
    duplicate_ack: bool


@dataclass(frozen=True)
class Booking:
    rail_reference: str
    accepted_at: object
    duplicate_reference: str | None


_rng_lock = threading.Lock()
_seeded: tuple[tuple, random.Random] | None = None


def _alias() -> str:
    return alias_for("railstub")


# The stub shares the box with every benchmark, so its per-request path is plain SQL: no ORM
# query compilation per request, and both statements are prepared once per pooled connection
# (dlock.prepared): PostgreSQL no longer parses and plans them per request (docs/CHANGELOG.md).
# The knobs an operator may turn (railstub_config); the read also returns when they last changed.
CONFIG_FIELDS = (
    "latency_ms",
    "failure_rate",
    "duplicate_ack_rate",
    "decline_rate",
    "split_5xx",
    "split_drop_before",
    "split_drop_after",
    "hold_ms",
    "seed",
)
_CONFIG_FIELDS = (*CONFIG_FIELDS, "updated_at")
CONFIG_SQL = f"SELECT {', '.join(_CONFIG_FIELDS)} FROM railstub_config WHERE id = 1"
# One statement per call, so one round trip and one commit: the request log row, and for a
# booking the transfer (two on a duplicate ack) with `duplicate_of` pointing at the first
# transfer ever booked for this clientRef (the data-modifying CTE always runs to completion).
_FIRST_TRANSFER = """
SELECT rail_reference FROM rail_transfer WHERE client_ref = %(client_ref)s
 ORDER BY accepted_at, rail_reference LIMIT 1
"""
_BOOKED_ONE = "(%(reference)s, %(client_ref)s, %(amount_minor)s, %(currency)s, %(accepted_at)s,"
_BOOKED = {
    False: f"{_BOOKED_ONE} (SELECT rail_reference FROM first))",
    True: f"{_BOOKED_ONE} (SELECT rail_reference FROM first)),"
    " (%(duplicate)s, %(client_ref)s, %(amount_minor)s, %(currency)s, %(duplicate_at)s,"
    " COALESCE((SELECT rail_reference FROM first), %(reference)s))",
}
INSERT_REQUEST_SQL = """
INSERT INTO rail_request (client_ref, amount_minor, currency, received_at, fault, rail_reference)
VALUES (%(client_ref)s, %(amount_minor)s, %(currency)s, %(received_at)s, %(fault)s, %(reference)s)
"""
BOOK_AND_LOG_SQL = {
    duplicate: f"""
WITH first AS ({_FIRST_TRANSFER}), booked AS (
INSERT INTO rail_transfer (rail_reference, client_ref, amount_minor, currency, accepted_at,
                           duplicate_of)
VALUES {values}
RETURNING 1)
{INSERT_REQUEST_SQL}"""
    for duplicate, values in _BOOKED.items()
}


def load_config() -> RailstubConfig:
    with prepared_cursor(_alias()) as cur:
        cur.execute(CONFIG_SQL)
        row = cur.fetchone()
    if row is None:
        return RailstubConfig(id=1)
    return RailstubConfig(id=1, **dict(zip(_CONFIG_FIELDS, row, strict=True)))


def _draws(config: RailstubConfig, count: int) -> list[float]:
    """`count` uniform draws; reproducible from the config seed: writing the config (even with
    the same seed) restarts the stream, so one process replays the same fault sequence."""
    global _seeded
    with _rng_lock:
        if config.seed is None:
            return [random.random() for _ in range(count)]
        stream = (config.seed, config.updated_at)
        if _seeded is None or _seeded[0] != stream:
            _seeded = (stream, random.Random(config.seed))
        return [_seeded[1].random() for _ in range(count)]


def choose_fault(config: RailstubConfig) -> Decision:
    decline, failure, which, duplicate = _draws(config, 4)
    if decline < config.decline_rate:
        return Decision(Fault.DECLINED, False)
    if failure < config.failure_rate:
        weights = [
            (Fault.ERROR_5XX, config.split_5xx),
            (Fault.DROP_BEFORE_BOOKING, config.split_drop_before),
            (Fault.DROP_AFTER_BOOKING, config.split_drop_after),
        ]
        total = sum(weight for _, weight in weights)
        if total > 0:
            point = which * total
            for fault, weight in weights:
                if point < weight:
                    return Decision(fault, duplicate < config.duplicate_ack_rate)
                point -= weight
    return Decision(Fault.OK, duplicate < config.duplicate_ack_rate)


def new_reference() -> str:
    return f"RR-{secrets.token_hex(10).upper()}"


def record_call(
    *, client_ref: str, amount_minor: int, currency: str, decision: Decision
) -> Booking | None:
    """Log the call in the stub's books and, for ok and drop-after, book the transfer (two on a
    duplicate ack); a repeated clientRef is simply paid again. The booking, or None."""
    books = decision.fault in (Fault.OK, Fault.DROP_AFTER_BOOKING)
    params: dict[str, Any] = {
        "client_ref": client_ref,
        "amount_minor": amount_minor,
        "currency": currency,
        "fault": decision.fault.value,
        "reference": None,
    }
    booking = None
    if books:
        booking = Booking(
            new_reference(),
            utcnow(),
            new_reference() if decision.duplicate_ack else None,
        )
        params.update(reference=booking.rail_reference, accepted_at=booking.accepted_at)
        if booking.duplicate_reference:
            params.update(duplicate=booking.duplicate_reference, duplicate_at=utcnow())
    params["received_at"] = utcnow()
    sql = BOOK_AND_LOG_SQL[decision.duplicate_ack] if books else INSERT_REQUEST_SQL
    with prepared_cursor(_alias()) as cur:
        cur.execute(sql, params)
    return booking


def statement(*, client_ref: str | None = None) -> list[RailTransfer]:
    rows = RailTransfer.objects.using(_alias()).all()
    if client_ref is not None:
        rows = rows.filter(client_ref=client_ref)
    return list(rows.order_by("accepted_at", "rail_reference"))


def update_config(**changes: object) -> RailstubConfig:
    """Change any of CONFIG_FIELDS on the single row (created if absent); others stay."""
    unknown = set(changes) - set(CONFIG_FIELDS)
    if unknown:
        raise ValueError(f"unknown config fields: {sorted(unknown)}")
    alias = _alias()
    with transaction.atomic(using=alias):
        config, _ = RailstubConfig.objects.using(alias).select_for_update().get_or_create(id=1)
        for name, value in changes.items():
            setattr(config, name, value)
        config.save(using=alias)
    return config


def reset_config() -> RailstubConfig:
    """All rates 0, no latency: a well-behaved rail."""
    defaults = RailstubConfig(id=1)
    return update_config(**{name: getattr(defaults, name) for name in CONFIG_FIELDS})


def config_dict(config: RailstubConfig) -> dict:
    return {
        "latencyMs": config.latency_ms,
        "failureRate": config.failure_rate,
        "duplicateAckRate": config.duplicate_ack_rate,
        "declineRate": config.decline_rate,
        "split5xx": config.split_5xx,
        "splitDropBefore": config.split_drop_before,
        "splitDropAfter": config.split_drop_after,
        "holdMs": config.hold_ms,
        "seed": config.seed,
    }
