"""CPU per event log line, in process (issue 18: the event logs' share of every role).

`python -m bench.logs [--events N] [--rounds R]`: the lock server's `lock_acquired` event (six
fields) written to /dev/null through a StreamHandler on the root logger, as the roles' LOGGING
sets it up, two ways, interleaved round by round: "before" is Logger.log with
python-json-logger's own format (dlock.logs.JsonFormatter with its fast path off: the path a
record with exception information still takes), "after" is `log_event` and the fast path.
Thread CPU per event, medians over the rounds; the lines must be equal but for `ts`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time

from dlock import logs

FIELDS = {
    "backend": "pg",
    "key": "acct-0123456789abcdef",
    "fencingToken": 123456,
    "ownerId": "executor-1",
    "sessionId": "5b7f7a8e-1c1e-4a3f-9d7e-2f0c8f1a2b3c",
    "expiresAt": "2026-12-01T18:53:24.123Z",
}


def _before() -> None:
    logs._logger.log(logging.INFO, "lock_acquired", extra={"event": "lock_acquired", **FIELDS})


def _after() -> None:
    logs.log_event("lock_acquired", **FIELDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    sink = open(os.devnull, "w")  # lives as long as the run
    handler = logging.StreamHandler(sink)
    fast = logs.JsonFormatter(service="lock-server")
    slow = logs.JsonFormatter(service="lock-server")
    slow._fast = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)

    lines = {}
    for name, formatter, emit in (("before", slow, _before), ("after", fast, _after)):
        keep = logging.Handler()
        keep.emit = lambda record, n=name, f=formatter: lines.__setitem__(n, f.format(record))
        root.addHandler(keep)
        emit()
        root.removeHandler(keep)
    parsed = {n: json.loads(line) for n, line in lines.items()}
    for line in parsed.values():
        line.pop("ts")
    assert parsed["before"] == parsed["after"], parsed

    results: dict[str, list[float]] = {"before": [], "after": []}
    arms = [("before", slow, _before), ("after", fast, _after)]
    for index in range(options.rounds):
        for name, formatter, emit in arms if index % 2 == 0 else arms[::-1]:
            handler.setFormatter(formatter)
            started = time.thread_time_ns()
            for _ in range(options.events):
                emit()
            results[name].append((time.thread_time_ns() - started) / options.events / 1000)
    before, after = (statistics.median(results[n]) for n in ("before", "after"))
    print(f"load average {os.getloadavg()[0]:.2f}; {options.rounds} rounds of {options.events}")
    for name in ("before", "after"):
        print(
            f"  {name:6} µs/event: median {statistics.median(results[name]):.2f}  "
            f"rounds {' '.join(f'{v:.2f}' for v in results[name])}"
        )
    print(f"  after / before: {after / before:.3f}")


if __name__ == "__main__":
    main()
