"""CPU per event log line, in process (the event logs' share of every role).

`python -m bench.logs [--events N] [--rounds R]`: the lock server's `lock_acquired` event (six
fields) through `log_event` to /dev/null by a StreamHandler on the root logger, as the roles'
LOGGING sets it up, three ways, interleaved round by round: "dlock" is dlock.logs.JsonFormatter
(python-json-logger's orjson formatter, what the roles use), "dlock-non-ascii" the same with
one non-ASCII field (the line the standard library's encoder writes), "stdlib" python-json-
logger's standard-library JsonFormatter configured with the same fields (the alternative).
Thread CPU per event, medians over the rounds.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time
from typing import Any

from pythonjsonlogger.json import JsonFormatter as StdlibJsonFormatter

from dlock import logs
from dlock.tracing import current_trace_id

FIELDS = {
    "backend": "pg",
    "key": "acct-0123456789abcdef",
    "fencingToken": 123456,
    "ownerId": "executor-1",
    "sessionId": "5b7f7a8e-1c1e-4a3f-9d7e-2f0c8f1a2b3c",
    "expiresAt": "2026-12-01T18:53:24.123Z",
}


class _Stdlib(StdlibJsonFormatter):
    def __init__(self) -> None:
        reference = logs.JsonFormatter(service="lock-server")
        super().__init__(
            "%(message)s %(levelname)s %(name)s",
            timestamp="ts",
            rename_fields=reference.rename_fields,
            static_fields=reference.static_fields,
            defaults=reference.defaults,
            reserved_attrs=sorted(reference.reserved_attrs),
        )

    def add_fields(self, log_data: dict[str, Any], record: Any, message_dict: dict) -> None:
        super().add_fields(log_data, record, message_dict)
        log_data["traceId"] = current_trace_id()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    sink = open(os.devnull, "w")  # lives as long as the run
    handler = logging.StreamHandler(sink)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    ascii_fields = FIELDS
    other_fields = {**FIELDS, "ownerId": "exécuteur-1"}
    arms = [
        ("dlock", logs.JsonFormatter(service="lock-server"), ascii_fields),
        ("dlock-non-ascii", logs.JsonFormatter(service="lock-server"), other_fields),
        ("stdlib", _Stdlib(), ascii_fields),
    ]
    results: dict[str, list[float]] = {name: [] for name, _, _ in arms}
    for index in range(options.rounds):
        for name, formatter, fields in arms if index % 2 == 0 else arms[::-1]:
            handler.setFormatter(formatter)
            started = time.thread_time_ns()
            for _ in range(options.events):
                logs.log_event("lock_acquired", **fields)
            results[name].append((time.thread_time_ns() - started) / options.events / 1000)
    print(f"load average {os.getloadavg()[0]:.2f}; {options.rounds} rounds of {options.events}")
    for name, values in results.items():
        print(
            f"  {name:15} µs/event: median {statistics.median(values):.2f}  "
            f"rounds {' '.join(f'{v:.2f}' for v in values)}"
        )


if __name__ == "__main__":
    main()
