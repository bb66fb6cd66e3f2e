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
    """The hints after a demo: every line stands alone (no trailing backslash continues one)."""
    pay = env.get("PAYMENTS_URL", "http://127.0.0.1:8082")
    lock = env.get("LOCK_SERVER_URL", "http://127.0.0.1:8081")
    proxy = env.get("RAIL_PROXY_URL", "http://127.0.0.1:8083")
    stub = env.get("RAIL_STUB_URL", "http://127.0.0.1:8084")
    admin = env.get("ADMIN_URL", "http://127.0.0.1:8085")
    admin_line = (
        f"{admin}/admin/\n    create a staff user first (once):\n"
        "      set -a; . .run/stack.env; set +a; ROLE=admin .venv/bin/python manage.py "
        "createsuperuser\n"
        '    locked out after too many failed log-ins (docs/operations.md "The admin"): the same\n'
        "      with `axes_reset_username NAME` instead of `createsuperuser`"
    )
    ops = "ROLE=ops .venv/bin/python manage.py"
    apply = f'{ops} record_rail_recovery --all-from-reconcile --reason "rail duplicate acks"'
    resolve = f'{ops} resolve_payout PAYOUT_ID --to POSTED|FAILED --note "what the statement shows"'
    recovered = f"{ops} close_rail_recovery --transfer RAIL_REF --recovered --reference RETURN_REF"
    return f"""
Where to look next
  Admin (payouts, ledger, the RAIL_AMBIGUOUS quarantine, rail recoveries):  {admin_line}
  Browsable API (GET in a browser):  {pay}/v1/payouts?state=POSTED
                                     {pay}/v1/payouts?state=RAIL_AMBIGUOUS
                                     {lock}/v1/locks/payout:<accountId>
  API docs (Swagger UI):             {pay}/v1/docs  {lock}/v1/docs  {proxy}/v1/docs
  Prometheus metrics:                {pay}/metrics  {proxy}/metrics  {lock}/metrics
                                     (lock_fenced_out_total{{resource=...}}, rail_submission_total)
  Prometheus with the alert rules:   make monitor   (http://127.0.0.1:9090)

  The commands below need the stack's environment first:  set -a; . .run/stack.env; set +a
  The rail's statement:              {ops} rail_statement
                                     (stub at {stub})
  Reconciler:                        {ops} reconcile
                                     (exit 1 while the rail's duplicate acks are not recorded:
                                     a finding for a human, not a fencing failure; each finding
                                     prints its own reference, the transfers that need a rail
                                     recovery and the exact next commands)
  Close the books (docs/books.md):
    1. the duplicates, as one reviewed plan:
         {ops} record_rail_recovery --all-from-reconcile --dry-run --operator YOU
         {apply} --operator YOU
    2. the quarantine, the safe way (reconcile prints each payout's command):
         {ops} reconcile
         {resolve} --operator YOU
    3. the recoveries, when the money is back (or given up):
         {ops} list_rail_recoveries
         {recovered} --operator YOU
         {ops} close_rail_recovery --transfer RAIL_REF --written-off --reason "why" --operator YOU
    4. {ops} reconcile   (exit 0: the books agree with the rail's statement)
    (YOU: your admin user; or do each step in the admin)
  JSON report / chart:               {out / "report.json"}
                                     {out / "report.png"}
  Fenced vs naive, same faults:      make experiment   (and `make bench` for the numbers)
  Stop everything:                   make down
"""
