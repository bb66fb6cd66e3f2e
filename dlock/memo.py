"""A bounded process-local map for facts that are written once and never change (which account
a payout belongs to, which credential opened a session): read from the database the first time
a process needs one, then kept, so a hot path skips that round trip. Only found rows are kept:
an unknown key is read again (it may be written later)."""

from __future__ import annotations


class WriteOnceMap:
    """Oldest entry out first beyond `limit`. No lock: under the GIL a racing thread at worst
    reads the row again and stores the same value."""

    def __init__(self, limit: int = 100_000) -> None:
        self._limit = limit
        self._values: dict[str, str] = {}

    def get(self, key: object) -> str | None:
        return self._values.get(str(key))

    def remember(self, key: object, value: str) -> None:
        if len(self._values) >= self._limit:
            self._values.pop(next(iter(self._values)), None)  # dicts keep insertion order
        self._values[str(key)] = value
