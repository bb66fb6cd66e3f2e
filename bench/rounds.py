"""Interleaved rounds, as every comparing part of the bench runs them: each arm once per round,
the order rotated by one each round (no arm always first on a warm or a cold box), and medians
over rounds that skip what a round could not measure."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotated(arms: Sequence[T], index: int) -> list[T]:
    """Round `index`'s order: the arms rotated by `index`."""
    shift = index % len(arms) if arms else 0
    return [*arms[shift:], *arms[:shift]]


def plan(arms: Sequence[T], rounds: int) -> list[list[T]]:
    """Every arm once per round, the order rotated by one each round."""
    return [rotated(arms, index) for index in range(rounds)]


def median(values: Sequence[float | None]) -> float | None:
    """The median of the known values, to 3 places; None when no round measured one."""
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 3) if known else None
