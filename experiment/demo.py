"""`make demo`'s run: a short fenced experiment on the running stack, then where to look next.

`python -m devstack.demo` (the make target) checks the stack and runs `fencing_experiment --demo`
in a process of its own; the command reads this module: the demo's sizes, what it says before,
and what it says after.
"""

from __future__ import annotations

from pathlib import Path

DEMO_PRESET = {
    "arm": "fenced",
    "executors": 2,
    "executor_concurrency": 4,  # 2 processes × 4 payouts in flight
    "payouts": 96,
    "duration": 30.0,
    "lease_ms": 2000,
    "drain_timeout": 60.0,
}


def banner(text: str) -> str:
    return f"\n=== {text} ==="


def introduction(
    executors: int, concurrency: int, payouts: int, lease_ms: int, duration: float
) -> str:
    return (
        banner("dlock demo: pay payouts while we try hard to make the system pay twice")
        + f"\n{executors} executors × {concurrency} payouts in flight,"
        f" {payouts} payouts, lease {lease_ms} ms, "
        f"{duration:.0f} s of faults: executors SIGSTOPped past their lease in every phase,"
        " kill -9, restarts of the rail proxy, payments and lock server, a PostgreSQL restart,"
        " a rail slower than the lease, failing and duplicate-acking. Then a drain and the"
        " reconciler."
    )


def verdict_line(code: int) -> str | None:
    """What the demo says about the experiment's exit code (1: failed, 3: inconclusive)."""
    if code == 1:
        return "[dlock] DEMO FAILED: the fenced system paid twice or broke an invariant (above)."
    if code == 3:
        return "[dlock] note: the faults did not produce a fenced-out stale writer this time."
    return None


def where(env: dict[str, str], out: Path) -> str:
    pay = env.get("PAYMENTS_URL", "http://127.0.0.1:8082")
    lock = env.get("LOCK_SERVER_URL", "http://127.0.0.1:8081")
    proxy = env.get("RAIL_PROXY_URL", "http://127.0.0.1:8083")
    stub = env.get("RAIL_STUB_URL", "http://127.0.0.1:8084")
    return f"""
Where to look next
  Admin (payouts, ledger, the RAIL_AMBIGUOUS quarantine):  {pay}/admin/
    create a staff user first:
      set -a; . .run/stack.env; set +a; ROLE=payments .venv/bin/python manage.py createsuperuser
  Browsable API (GET in a browser):  {pay}/v1/payouts?state=POSTED
                                     {pay}/v1/payouts?state=RAIL_AMBIGUOUS
                                     {lock}/v1/locks/payout:<accountId>
  API docs (Swagger UI):             {pay}/v1/docs  {lock}/v1/docs  {proxy}/v1/docs
  Prometheus metrics:                {pay}/metrics  {proxy}/metrics  {lock}/metrics
                                     (lock_fenced_out_total{{resource=...}}, rail_submission_total)
  (the commands below need the stack's environment: set -a; . .run/stack.env; set +a)
  The rail's statement:              ROLE=ops .venv/bin/python manage.py rail_statement
                                     (stub at {stub})
  Reconciler:                        ROLE=ops .venv/bin/python manage.py reconcile
                                     (it exits 1 while the rail's own duplicate acks are not
                                     yet recorded: a finding for a human, not a fencing failure)
  Close the books (docs/operations.md "Rail recoveries"): for each duplicate transfer
                                     ROLE=ops .venv/bin/python manage.py record_rail_recovery \
                                       --transfer RAIL-REF --reason "..." --operator YOU
                                     resolve the quarantine the safe way:
                                     ROLE=ops .venv/bin/python manage.py resolve_payout ID \
                                       --to POSTED|FAILED --note "..." --operator YOU
                                     (or the admin: reconciler findings, rail recoveries)
  JSON report / chart:               {out / "report.json"}
                                     {out / "report.png"}
  Fenced vs naive, same faults:      make experiment   (and `make bench` for the numbers)
  Stop everything:                   make down
"""
