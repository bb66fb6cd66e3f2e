"""What each arm did, read from the ground truth: paydb, the rail's statement, /metrics.

The rail statement (raildb `rail_transfer`) is the only truth about money that moved. A payout
"we paid twice" has more than one *presented* attempt (our submissions) or more than one booked
transfer that is not a duplicate the rail made on its own (`duplicate_of` set).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

import psycopg

from experiment.stack import scrape
from payments.models import CLAIMABLE_STATES
from payments.selectors import account_books, payout_state_counts, payout_summaries

FENCED_NON_TERMINAL = ("PENDING", "CLAIMED", "SUBMITTING", "RAIL_ACKED")
NAIVE_NON_TERMINAL = ("PENDING", "CLAIMED")
PRESENTED = (
    "PENDING",
    "ACKED",
    "TIMEOUT",
    "DECLINED",
)  # rail_submission outcomes that hit the rail

NAIVE_STATES = (
    "SELECT state, count(*) FROM experiment_naive_payout WHERE run_id = %s GROUP BY state"
)
FENCED_SUBMISSIONS = """
SELECT payout_id::text, outcome, client_ref FROM rail_submission WHERE payout_id = ANY(%s::uuid[])
"""
NAIVE_ATTEMPTS = """
SELECT payout_id::text, coalesce(outcome, 'PENDING'), payout_id::text
  FROM experiment_naive_attempt WHERE run_id = %s
"""
REQUESTS = """
SELECT client_ref, fault FROM rail_request WHERE client_ref = ANY(%s)
"""
BOOKING_FAULTS = ("ok", "drop_after_booking")  # a request with these faults booked one transfer
TRANSFERS = """
SELECT client_ref, rail_reference, duplicate_of, amount_minor FROM rail_transfer
 WHERE client_ref = ANY(%s)
"""
NAIVE_PAYOUTS = """
SELECT payout_id::text, account_id, state, amount_minor FROM experiment_naive_payout
 WHERE run_id = %s
"""
NAIVE_BALANCES = """
SELECT a.account_id, a.balance_minor,
       coalesce(sum(CASE WHEN e.direction = 'CREDIT' THEN e.amount_minor
                         ELSE -e.amount_minor END), 0)
  FROM experiment_naive_account a
  LEFT JOIN experiment_naive_ledger e ON e.account_id = a.account_id AND e.run_id = a.run_id
 WHERE a.run_id = %s GROUP BY a.account_id, a.balance_minor
"""
FENCED_PAYOUT_LEDGER = """
SELECT payout_id::text, direction, amount_minor FROM ledger_entry WHERE payout_id = ANY(%s::uuid[])
"""
NAIVE_PAYOUT_LEDGER = """
SELECT payout_id::text, direction, amount_minor FROM experiment_naive_ledger
 WHERE run_id = %s AND payout_id IS NOT NULL
"""
RECONCILIATION = """
SELECT payout_id::text, classification FROM payout_reconciliation WHERE payout_id = ANY(%s::uuid[])
"""

METRIC_LINE = re.compile(r"^(?P<name>[a-z_]+)\{(?P<labels>[^}]*)\}\s+(?P<value>[-+0-9.eE]+)$")


def state_counts(pay_url: str, *, arm: str, payout_ids: list[str], run_id: str) -> dict[str, int]:
    with psycopg.connect(pay_url, connect_timeout=2) as conn:
        if arm == "fenced":
            return payout_state_counts(conn.cursor(), payout_ids=payout_ids)
        rows = conn.execute(NAIVE_STATES, (run_id,)).fetchall()
    return {state: n for state, n in rows}


CLAIMABLE_ELSEWHERE = """
SELECT count(*) FROM payout WHERE state = ANY(%s) AND NOT (payout_id = ANY(%s::uuid[]))
"""


def claimable_elsewhere(pay_url: str, payout_ids: list[str]) -> int:
    """Payouts of earlier runs (not `payout_ids`) that executors would still claim: the run's
    executors spend their time on those too, so its payout rates would not be this run's."""
    with psycopg.connect(pay_url, connect_timeout=5) as conn:
        row = conn.execute(CLAIMABLE_ELSEWHERE, (list(CLAIMABLE_STATES), payout_ids)).fetchone()
    return int(row[0]) if row else 0


POSTED_AT = """
SELECT extract(epoch FROM at)::float8 FROM payout_event
 WHERE to_state = 'POSTED' AND payout_id = ANY(%s::uuid[]) ORDER BY at
"""


def posted_times(pay_url: str, payout_ids: list[str]) -> list[float]:
    """Wall-clock times (epoch s) of the payouts' POSTED transitions, from payout_event."""
    with psycopg.connect(pay_url, connect_timeout=5) as conn:
        return [row[0] for row in conn.execute(POSTED_AT, (payout_ids,)).fetchall()]


class CounterScraper:
    """Sums a Prometheus counter across scrapes of processes that restart (a counter that went
    down means the process restarted and counts from zero again)."""

    def __init__(self, metric: str, label: str) -> None:
        self.metric = metric
        self.label = label
        self.last: dict[tuple[str, str], float] = {}
        self.total: Counter[str] = Counter()
        self.baseline_done: set[str] = set()

    def parse(self, text: str) -> dict[str, float]:
        values: dict[str, float] = {}
        for line in text.splitlines():
            match = METRIC_LINE.match(line.strip())
            if not match or match["name"] != self.metric:
                continue
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"]))
            if self.label in labels:
                values[labels[self.label]] = float(match["value"])
        return values

    def observe(self, source: str, text: str | None, *, baseline: bool = False) -> None:
        if text is None:
            return
        for key, value in self.parse(text).items():
            previous = self.last.get((source, key))
            if previous is None:
                # First sight of a long-running service counts from here; a new worker from 0.
                if not baseline:
                    self.total[key] += value
            elif value >= previous:
                self.total[key] += value - previous
            else:
                self.total[key] += value  # restarted
            self.last[(source, key)] = value

    def scrape(self, source: str, url: str, *, baseline: bool = False) -> None:
        self.observe(source, scrape(url), baseline=baseline)


def collect(
    *,
    arm: str,
    pay_url: str,
    rail_url_db: str,
    payout_ids: list[str],
    account_ids: list[str],
    run_id: str,
) -> dict:
    """Everything the report needs about one arm, from the databases."""
    with psycopg.connect(pay_url) as conn:
        if arm == "fenced":
            payouts = payout_summaries(conn.cursor(), payout_ids=payout_ids)
            subs = conn.execute(FENCED_SUBMISSIONS, (payout_ids,)).fetchall()
            balances = account_books(conn.cursor(), account_ids=account_ids, settlement=True)
            entries = conn.execute(FENCED_PAYOUT_LEDGER, (payout_ids,)).fetchall()
            try:
                recon = dict(conn.execute(RECONCILIATION, (payout_ids,)).fetchall())
            except psycopg.Error:
                recon = {}
        else:
            payouts = conn.execute(NAIVE_PAYOUTS, (run_id,)).fetchall()
            subs = conn.execute(NAIVE_ATTEMPTS, (run_id,)).fetchall()
            balances = conn.execute(NAIVE_BALANCES, (run_id,)).fetchall()
            entries = conn.execute(NAIVE_PAYOUT_LEDGER, (run_id,)).fetchall()
            recon = {}
    ref_to_payout = {str(client_ref): pid for pid, _o, client_ref in subs if client_ref}
    ref_to_payout.update({pid: pid for pid, *_ in payouts})
    with psycopg.connect(rail_url_db) as conn:
        transfers = conn.execute(TRANSFERS, (list(ref_to_payout),)).fetchall()
        requests = conn.execute(REQUESTS, (list(ref_to_payout),)).fetchall()

    state_of = {pid: state for pid, _a, state, _m in payouts}
    counted = _count_presented(state_of, subs, requests, transfers, ref_to_payout)
    violations = _invariant_violations(arm, payouts, balances, entries, counted)
    caused, presented = counted["caused"], counted["presented"]
    rail_dups, outcomes, histogram = counted["rail_dups"], counted["outcomes"], counted["histogram"]
    paid_twice, money_out = counted["paid_twice"], counted["money_out"]
    debits = sum(m for _p, d, m in entries if d == "DEBIT")
    ambiguous = [pid for pid, state in state_of.items() if state == "RAIL_AMBIGUOUS"]
    # Read before the arm's own reconcile: the fenced arm replaces this with the classification
    # of the reconcile it runs after collecting (experiment/arms/fenced.py).
    classification = Counter(recon.get(pid, "UNCLASSIFIED") for pid in ambiguous)
    return {
        "payouts": len(payouts),
        "by_state": dict(Counter(state_of.values())),
        "submission_outcomes": dict(outcomes),
        "presented_attempts_histogram": {str(k): v for k, v in sorted(histogram.items())},
        "duplicates_caused": len(caused),
        "duplicate_payout_ids": caused[:20],
        "paid_twice_by_us": len(paid_twice),
        "presented_attempts_total": sum(presented.values()),
        "rail_duplicate_acks": sum(rail_dups.values()),
        "rail_duplicate_payout_ids": sorted(rail_dups),
        "rail_transfers": len(transfers),
        "money_out_minor": money_out,
        "ledger_debits_minor": debits,
        "ambiguous": len(ambiguous),
        "ambiguous_classification": dict(classification),
        "invariant_violations": violations[:50],
        "invariant_violation_count": len(violations),
    }


def _count_presented(
    state_of: dict[str, str],
    subs: list[tuple],
    requests: list[tuple],
    transfers: list[tuple],
    ref_to_payout: dict[str, str],
) -> dict:
    """Presented attempts, bookings and the rail's own duplicates, per payout."""
    # Presented attempts, from our side (submission rows) and from the rail's own request log;
    # the larger count wins (a request the rail saw is presented whatever we recorded).
    ours: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for pid, outcome, _ref in subs:
        outcomes[outcome] += 1
        if outcome in PRESENTED:
            ours[pid] += 1
    seen_by_rail: Counter[str] = Counter()
    booked_own: Counter[str] = Counter()  # bookings our requests caused
    for client_ref, fault in requests:
        pid = ref_to_payout[str(client_ref)]
        seen_by_rail[pid] += 1
        if fault in BOOKING_FAULTS:
            booked_own[pid] += 1
    presented = Counter({pid: max(ours[pid], seen_by_rail[pid]) for pid in state_of})
    transfers_of: Counter[str] = Counter()
    money_out = 0
    for client_ref, _ref, _duplicate_of, amount in transfers:
        transfers_of[ref_to_payout[str(client_ref)]] += 1
        money_out += amount
    # What the rail booked beyond what our requests asked for: its own duplicate acks.
    rail_dups = Counter(
        {
            pid: transfers_of[pid] - booked_own[pid]
            for pid in transfers_of
            if transfers_of[pid] > booked_own[pid]
        }
    )
    caused = sorted(pid for pid in state_of if presented[pid] > 1 or booked_own[pid] > 1)
    paid_twice = sorted(pid for pid in state_of if booked_own[pid] > 1)
    histogram = Counter(presented[pid] for pid in state_of)

    return {
        "outcomes": outcomes,
        "presented": presented,
        "booked_own": booked_own,
        "rail_dups": rail_dups,
        "caused": caused,
        "paid_twice": paid_twice,
        "histogram": histogram,
        "money_out": money_out,
    }


def _invariant_violations(
    arm: str, payouts: list[tuple], balances: list[tuple], entries: list[tuple], counted: dict
) -> list[str]:
    """The books (balance = ledger sum, debits = credits) and one booking per POSTED payout."""
    booked_own, presented, caused = counted["booked_own"], counted["presented"], counted["caused"]
    debits = sum(m for _p, d, m in entries if d == "DEBIT")
    credits = sum(m for _p, d, m in entries if d == "CREDIT")
    per_payout_debit: dict[str, int] = defaultdict(int)
    for pid, direction, amount in entries:
        if direction == "DEBIT":
            per_payout_debit[pid] += amount
    violations: list[str] = []
    if arm == "fenced" and debits != credits:
        violations.append(f"payout ledger debits {debits} != credits {credits}")
    for account, balance, ledger_sum in balances:
        if balance != ledger_sum:
            violations.append(f"account {account}: balance {balance} != ledger sum {ledger_sum}")
    for pid, _account, state, amount in payouts:
        if state == "POSTED" and booked_own[pid] != 1:
            violations.append(f"POSTED payout {pid} has {booked_own[pid]} booked transfers")
        if state == "POSTED" and per_payout_debit[pid] != amount:
            violations.append(f"POSTED payout {pid} debited {per_payout_debit[pid]} != {amount}")
        if state in ("FAILED", "PENDING", "ABANDONED") and booked_own[pid]:
            violations.append(f"{state} payout {pid} has {booked_own[pid]} booked transfers")
        if state != "POSTED" and per_payout_debit[pid]:
            violations.append(f"{state} payout {pid} has ledger debits")
    for pid in caused:
        violations.append(
            f"payout {pid} paid more than once: {presented[pid]} presented,"
            f" {booked_own[pid]} booked"
        )
    return violations
