"""Not a test: `pytest tests/executor/measure_concurrency.py -s` prints payouts/s of ONE
run_executor process at concurrency 1, 8 and 32 with a 200 ms rail (the measurement proper:
`python -m bench --only e2e`)."""

from __future__ import annotations

import json
import time
import uuid

from tests.executor.conftest import paydb, payout_ids, seed, start_executor


def _rate(stack, ids):
    with paydb(stack) as conn:
        first, last, posted = conn.execute(
            "SELECT min(at) FILTER (WHERE to_state = 'CLAIMED'),"
            " max(at) FILTER (WHERE to_state = 'POSTED'),"
            " count(*) FILTER (WHERE to_state = 'POSTED')"
            " FROM payout_event WHERE payout_id::text = ANY(%s)",
            (ids,),
        ).fetchone()
    return posted, posted / (last - first).total_seconds()


def test_measure(exec_stack, rail, tmp_path):
    rail("--latency-ms", "200")
    results = {}
    for concurrency, per_account in ((1, 1), (8, 4), (32, 8)):
        seeded = seed(exec_stack, accounts=32, per_account=per_account, balance=10**9, amount=1)
        ids = payout_ids(seeded)
        proc = start_executor(
            exec_stack,
            f"bench-{concurrency}-{uuid.uuid4().hex[:4]}",
            "--until-idle",
            "--concurrency",
            str(concurrency),
            lock_ttl_ms=10_000,
            session_ttl_ms=10_000,
            log_dir=tmp_path,
        )
        started = time.monotonic()
        peak_rss_kb = 0
        while proc.process.poll() is None:
            try:
                status = open(f"/proc/{proc.pid}/status").read()
                rss = int(status.split("VmRSS:")[1].split()[0])
                peak_rss_kb = max(peak_rss_kb, rss)
            except (FileNotFoundError, IndexError):
                pass
            time.sleep(0.2)
        assert proc.process.returncode == 0, proc.log.read_text()[-2000:]
        posted, rate = _rate(exec_stack, ids)
        results[concurrency] = {
            "payouts": posted,
            "payouts_per_s": round(rate, 1),
            "wall_s": round(time.monotonic() - started, 1),
            "peak_rss_mb": round(peak_rss_kb / 1024, 1),
        }
    print("\nMEASURE", json.dumps(results))
