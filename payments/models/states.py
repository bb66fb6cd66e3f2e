"""The payout states and their sets, account kinds and ledger directions: the one definition
of each (ARCHITECTURE §3), as TextChoices and plain strings."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class PayoutState(models.TextChoices):
    PENDING = "PENDING"
    CLAIMED = "CLAIMED"
    SUBMITTING = "SUBMITTING"
    RAIL_ACKED = "RAIL_ACKED"
    POSTED = "POSTED"
    FAILED = "FAILED"
    ABANDONED = "ABANDONED"
    RAIL_AMBIGUOUS = "RAIL_AMBIGUOUS"


# The one definition of each set of payout states (ARCHITECTURE §3), as plain strings: payments
# and the rail proxy import these, and SQL binds them as parameters instead of spelling them out.
ALL_STATES: tuple[str, ...] = tuple(s.value for s in PayoutState)
# Payouts whose amount is committed but not yet debited (ARCHITECTURE §4 "available balance").
RESERVING_STATES: tuple[str, ...] = ("CLAIMED", "SUBMITTING", "RAIL_ACKED", "RAIL_AMBIGUOUS")
TERMINAL_STATES: tuple[str, ...] = ("POSTED", "FAILED", "ABANDONED")
# No automated (token-bearing) transition leaves these (ARCHITECTURE §3).
QUARANTINED_OR_TERMINAL: frozenset[str] = frozenset({"RAIL_AMBIGUOUS", *TERMINAL_STATES})
# P2 `expectedState`: a fresh claim, or a recovery re-claim of a CLAIMED payout.
CLAIMABLE_STATES: tuple[str, ...] = ("PENDING", "CLAIMED")
# Where an operator may resolve a RAIL_AMBIGUOUS payout to.
RESOLUTION_STATES: tuple[str, ...] = ("POSTED", "FAILED")

if not {*RESERVING_STATES, *QUARANTINED_OR_TERMINAL, *CLAIMABLE_STATES} <= set(ALL_STATES):
    raise RuntimeError("a payout state set names a state PayoutState lacks")  # pragma: no cover


class AccountKind(models.TextChoices):
    CUSTOMER = "CUSTOMER"
    SETTLEMENT = "SETTLEMENT"
    FUNDING = "FUNDING"
    # A receivable: money the rail paid out that no payout accounts for (rail recoveries).
    RECOVERABLE = "RECOVERABLE"
    # Money written off: a rail recovery closed WRITTEN_OFF.
    LOSS = "LOSS"


class Direction(models.TextChoices):
    DEBIT = "DEBIT"
    CREDIT = "CREDIT"


def choices_in(field: str, choices: type[models.TextChoices]) -> Q:
    return Q(**{f"{field}__in": [c.value for c in choices]})


def valid_choice(
    table: str, field: str, choices: type[models.TextChoices]
) -> models.CheckConstraint:
    """`<table>_<field>_valid`: the column holds one of the TextChoices' values."""
    return models.CheckConstraint(
        condition=choices_in(field, choices), name=f"{table}_{field}_valid"
    )


def amount_positive(table: str) -> models.CheckConstraint:
    """`<table>_amount_positive`: amount_minor > 0."""
    return models.CheckConstraint(condition=Q(amount_minor__gt=0), name=f"{table}_amount_positive")


def currency_iso4217(table: str) -> models.CheckConstraint:
    """`<table>_currency_iso4217`: three capital letters."""
    return models.CheckConstraint(
        condition=Q(currency__regex=r"^[A-Z]{3}$"), name=f"{table}_currency_iso4217"
    )


def reason_given(table: str) -> models.CheckConstraint:
    """`<table>_reason_given`: an operator's reason is never empty."""
    return models.CheckConstraint(condition=~Q(reason=""), name=f"{table}_reason_given")
