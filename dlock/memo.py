"""A bounded process-local map for facts that are written once and never change (which account
a payout belongs to, which credential opened a session): read from the database the first time
a process needs one, then kept, so a hot path skips that round trip. Only found rows are kept:
an unknown key is read again (it may be written later)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

K = TypeVar("K")


class WriteOnceMap:
    """Oldest entry out first beyond `limit` (~250 B an entry: ~4 MB; a fact is re-read within
    seconds), in O(1) (OrderedDict.popitem, not a scan past the slots evictions emptied). No
    lock: under the GIL a racing thread at worst reads the row again and stores the same value."""

    def __init__(self, limit: int = 16_384) -> None:
        self._limit = limit
        self._values: OrderedDict[str, str] = OrderedDict()

    def get(self, key: object) -> str | None:
        return self._values.get(str(key))

    def get_or_read(self, key: K, read: Callable[[K], str | None]) -> str | None:
        """The kept value, else `read(key)` (kept when found; None is never kept)."""
        value = self.get(key)
        if value is None:
            value = read(key)
            if value is not None:
                self.remember(key, value)
        return value

    def remember(self, key: object, value: str) -> None:
        if len(self._values) >= self._limit:
            try:
                self._values.popitem(last=False)
            except KeyError:  # another thread emptied it first
                pass
        self._values[str(key)] = value

    def __len__(self) -> int:
        return len(self._values)
