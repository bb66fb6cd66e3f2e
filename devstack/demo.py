"""`make demo`: the main job. `make up` has started the stack; this runs a short fenced experiment.

Steps: check the stack and the commands it needs (fail loudly, naming the missing piece) → seed
accounts and payouts → run two real executor processes, four payouts in flight each (issue 17),
against a slow, flaky, duplicate-acking rail while pausing (SIGSTOP past the lease), killing and
restarting workers and services → reconcile → print the report and where to look next (admin,
browsable API, /metrics, the JSON report).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from devstack.common import PROJECT

DEMO = {
    "seed": 7,
    "executors": 2,
    "executor_concurrency": 4,  # issue 17: 2 processes × 4 payouts in flight
    "payouts": 96,
    "duration": 30.0,
    "lease_ms": 2000,
    "drain_timeout": 60.0,
}


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def where(env: dict[str, str], out: Path) -> str:
    pay = env.get("PAYMENTS_URL", "http://127.0.0.1:8082")
    lock = env.get("LOCK_SERVER_URL", "http://127.0.0.1:8081")
    proxy = env.get("RAIL_PROXY_URL", "http://127.0.0.1:8083")
    stub = env.get("RAIL_STUB_URL", "http://127.0.0.1:8084")
    admin = env.get("ADMIN_URL", "http://127.0.0.1:8085")
    return f"""
Where to look next
  Admin (payouts, ledger, the RAIL_AMBIGUOUS quarantine):  {admin}/admin/
    create a staff user first:
      set -a; . .run/stack.env; set +a; ROLE=admin .venv/bin/python manage.py createsuperuser
    locked out after too many failed log-ins (docs/operations.md "The admin"): the same
      with `axes_reset_username NAME` instead of `createsuperuser`
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


def main() -> int:
    from experiment.stack import MissingPiece, from_stack_env

    out = Path(os.environ.get("DLOCK_DEMO_OUT", PROJECT / ".run" / "demo"))
    try:
        stack = from_stack_env()
    except MissingPiece as exc:
        print(f"[dlock] demo cannot start: {exc}", file=sys.stderr)
        return 1
    # The harness reads payouts through payments' selectors and the revoke fault pushes the new
    # floor through ops.revoke (Django models): this process needs what `make experiment` gives
    # `python -m django fencing_experiment`, before the harness is imported.
    for name, value in stack.env.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("ROLE", "ops")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.tooling")
    import django

    django.setup()
    from experiment.progress import LivePrinter
    from experiment.report import table
    from experiment.runner import ExperimentConfig, run

    config = ExperimentConfig(arm="fenced", out=out, **DEMO)
    banner("dlock demo: pay payouts while we try hard to make the system pay twice")
    print(
        f"{config.executors} executors × {config.executor_concurrency} payouts in flight,"
        f" {config.payouts} payouts, lease {config.lease_ms} ms, "
        f"{config.duration:.0f} s of faults: executors SIGSTOPped past their lease in every phase,"
        " kill -9, restarts of the rail proxy, payments and lock server, a PostgreSQL restart,"
        " a rail slower than the lease, failing and duplicate-acking. Then a drain and the"
        " reconciler.",
        flush=True,
    )
    try:
        code, report = run(stack, config, progress=LivePrinter())
    except MissingPiece as exc:
        print(f"\n[dlock] DEMO FAILED — a piece is missing:\n{exc}", file=sys.stderr)
        return 1
    banner("report")
    print(table(report))
    print(where(stack.env, out))
    if code == 1:
        print("[dlock] DEMO FAILED: the fenced system paid twice or broke an invariant (above).")
        return 1
    if code == 3:
        print("[dlock] note: the faults did not produce a fenced-out stale writer this time.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
