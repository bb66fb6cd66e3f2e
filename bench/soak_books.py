"""Whether the soak's books close: the experiment's ground truth about what was presented to the
rail and booked (experiment.measure), the reconciler's verdict (`manage.py reconcile`), and why
each quarantined payout was quarantined (its transition's note and the reconciler's class)."""

from __future__ import annotations

import json

import psycopg

from experiment.stack import StackHandle


def check_books(stack: StackHandle, ids: list[str]) -> dict:
    """The experiment's ground truth (experiment.measure) and the reconciler's verdict."""
    # imported here: they load payments' models, and Django is set up once the stack is up
    from experiment.arms.fenced import classified_after_reconcile
    from experiment.measure import collect
    from experiment.verdict import unexplained_findings

    truth = collect(
        arm="fenced",
        pay_url=stack.env["PAY_DATABASE_URL"],
        rail_url_db=stack.env["RAIL_DATABASE_URL"],
        payout_ids=ids,
        account_ids=[],
        run_id="",
    )
    result = stack.manage("reconcile", "--json", "--metrics-file", str(stack.run_dir / "r.prom"))
    reconcile: dict = {"exit_code": result.returncode}
    try:
        reconcile["report"] = json.loads(result.stdout)
    except ValueError:
        reconcile["output"] = (result.stdout + result.stderr)[-1500:]
    return {
        "truth": truth,
        "reconcile_exit_code": result.returncode,
        "unexplained": unexplained_findings(reconcile, truth, ids),
        "quarantine_classes": classified_after_reconcile(reconcile, ids),
        "quarantine_notes": quarantine_notes(stack.env["PAY_DATABASE_URL"], ids),
    }


QUARANTINE_NOTES = """
SELECT coalesce(from_state, '') || ': '
       || coalesce(regexp_replace(left(note, 160), '[0-9a-f-]{36}', '<id>', 'g'), '(no note)'),
       count(*)
  FROM payout_event WHERE to_state = 'RAIL_AMBIGUOUS' AND payout_id = ANY(%s::uuid[])
 GROUP BY 1 ORDER BY 2 DESC
"""


def quarantine_notes(pay_url: str, ids: list[str]) -> dict[str, int]:
    with psycopg.connect(pay_url) as conn:
        return dict(conn.execute(QUARANTINE_NOTES, (ids,)).fetchall())
