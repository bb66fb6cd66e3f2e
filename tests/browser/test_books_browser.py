"""Issue 26, done when: after a run where the rail duplicate-acks and times out, an operator in
headless Chromium records every duplicate as a rail recovery, resolves every quarantined payout
the safe way, closes one recovery RECOVERED and one WRITTEN_OFF; then `reconcile` exits 0,
payments exports reconcile_ok 1, every balance equals its ledger, and settlement, recoverable
and loss movements add up to the rail statement's total. Every unsafe variant is refused and
audited, in the admin and through the ops commands.

A private stack (its own databases), so the reconciler judges only this run's books; real
executors drive real payouts through real HTTP against the rail stub set by `railstub_config`.
"""

from __future__ import annotations

import json
import textwrap
import uuid

import psycopg
import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select

from payments.selectors import account_books, balance_sql
from tests.browser.conftest import submit_login_form, wait_for
from tests.conftest import start_stack, stop_stack
from tests.executor.conftest import STACK_ENV, drain, seed

pytestmark = [pytest.mark.live, pytest.mark.slow]

OPERATOR, PASSWORD = "ops-books-browser", "a-long-books-passphrase-1"
PAYOUT_ADMIN = "/admin/payments/payout"
QUARANTINE = "/admin/payments/quarantinedpayout"
RECOVERIES = "/admin/payments/railrecovery"


@pytest.fixture(scope="module")
def books_stack():
    stack = start_stack("books", STACK_ENV)
    stack.manage(
        "shell",
        "-c",
        textwrap.dedent(
            f"""
            from django.contrib.auth.models import User
            User.objects.create_superuser({OPERATOR!r}, password={PASSWORD!r})
            """
        ),
    )
    yield stack
    stop_stack(stack)


def paydb(stack, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def raildb(stack, sql: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(stack.env["RAIL_DATABASE_URL"], autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def run_phase(stack, tmp_path, name: str, *rail: str, payouts: int = 1) -> list[str]:
    """Seed payouts (one per account), turn the rail, drain with a real executor: the ids."""
    stack.manage("railstub_config", "--reset", *rail)
    seeded = seed(stack, accounts=payouts, per_account=1, balance=10_000, amount=700)
    drain(stack, tmp_path, f"exec-books-{name}")
    return [str(p) if isinstance(p, str) else str(p["payoutId"]) for p in seeded["payouts"]]


def bad_rail_day(
    stack, tmp_path, *, duplicate_acked: int
) -> tuple[list[str], list[str], list[str]]:
    """The rail's bad day: `duplicate_acked` payouts duplicate-acked (POSTED), one booked then
    dropped and one dropped unbooked (both RAIL_AMBIGUOUS); the rail reset after. The ids of
    each: (duplicated, booked once, not booked)."""
    duplicated = run_phase(
        stack, tmp_path, "dup", "--duplicate-ack-rate", "1", payouts=duplicate_acked
    )
    booked_once = run_phase(
        stack,
        tmp_path,
        "after",
        "--failure-rate",
        "1",
        "--split-5xx",
        "0",
        "--split-drop-before",
        "0",
        "--split-drop-after",
        "1",
    )
    not_booked = run_phase(
        stack,
        tmp_path,
        "before",
        "--failure-rate",
        "1",
        "--split-5xx",
        "0",
        "--split-drop-before",
        "1",
        "--split-drop-after",
        "0",
        "--hold-ms",
        "100",
    )
    stack.manage("railstub_config", "--reset")
    assert set(states(stack, duplicated).values()) == {"POSTED"}
    assert set(states(stack, booked_once + not_booked).values()) == {"RAIL_AMBIGUOUS"}
    return duplicated, booked_once, not_booked


def states(stack, ids: list[str]) -> dict[str, str]:
    rows = paydb(
        stack, "SELECT payout_id::text, state FROM payout WHERE payout_id::text = ANY(%s)", (ids,)
    )
    return dict(rows)


def transfers_of(stack, payout_id: str) -> list[tuple[str, int]]:
    return [
        (ref, int(amount))
        for ref, amount in raildb(
            stack,
            "SELECT rail_reference, amount_minor FROM rail_transfer WHERE client_ref = %s"
            " ORDER BY accepted_at, rail_reference",
            (payout_id,),
        )
    ]


def reconcile(stack, tmp_path) -> tuple[int, dict]:
    prom = tmp_path / "reconcile.prom"
    result = stack.manage("reconcile", "--json", "--metrics-file", str(prom), check=False)
    return result.returncode, json.loads(result.stdout)


SCRAPED = (
    "reconcile_ok",
    "rail_recoveries_open",
    "rail_recovery_oldest_open_age_seconds",
    'payout_backlog_oldest_age_seconds{state="PENDING"}',
)


def scrape(stack) -> dict[str, float]:
    text = requests.get(f"{stack.url('payments')}/metrics", timeout=10).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.rpartition(" ")
        if name in SCRAPED:
            found[name] = float(value)
    return found


def command(stack, *args: str):
    return stack.manage(*args, "--operator", OPERATOR, "--json", check=False)


def message(driver) -> tuple[str, str]:
    """The admin's first message after a form: (level, text)."""
    item = wait_for(driver, "ul.messagelist li")
    return item.get_attribute("class"), item.text


class Operator:
    def __init__(self, driver, base: str) -> None:
        self.driver, self.base = driver, base

    def log_in(self) -> None:
        self.driver.delete_all_cookies()
        submit_login_form(self.driver, self.base, OPERATOR, PASSWORD)
        wait_for(self.driver, "#user-tools")  # signed in, not the login page again

    def open(self, path: str) -> None:
        self.driver.get(f"{self.base}{path}")
        wait_for(self.driver, "#content")

    def record_from_payout_page(self, payout_id: str, reference: str, reason: str):
        """From the payout's page: the statement's transfer row → "Record as rail recovery…"."""
        self.open(f"{PAYOUT_ADMIN}/{payout_id}/change/")
        row = self.driver.find_element(
            By.CSS_SELECTOR, f'#transfers tr.transfer[data-reference="{reference}"]'
        )
        row.find_element(By.CSS_SELECTOR, "a.record-recovery").click()
        wait_for(self.driver, "#recovery-form")
        assert self.driver.find_element(By.NAME, "transfer").get_attribute("value") == reference
        self.driver.find_element(By.NAME, "reason").send_keys(reason)
        self.driver.find_element(By.ID, "recovery-submit").click()
        return message(self.driver)

    def record_by_hand(self, reference: str, reason: str):
        self.open(f"{RECOVERIES}/add/")
        self.driver.find_element(By.NAME, "transfer").send_keys(reference)
        self.driver.find_element(By.NAME, "reason").send_keys(reason)
        self.driver.find_element(By.ID, "recovery-submit").click()
        return message(self.driver)

    def resolve(self, payout_id: str, note: str, *, to: str | None = None):
        """The quarantine's resolve page; returns (preselected resolution, message)."""
        self.open(f"{QUARANTINE}/{payout_id}/resolve/")
        select = Select(self.driver.find_element(By.NAME, "resolution"))
        preselected = select.first_selected_option.get_attribute("value")
        if to is not None:
            select.select_by_value(to)
        self.driver.find_element(By.NAME, "note").send_keys(note)
        self.driver.find_element(By.ID, "resolve-submit").click()
        return preselected, message(self.driver)

    def close(self, recovery_id: str, outcome: str, *, reference: str = "", reason: str = ""):
        self.open(f"{RECOVERIES}/{recovery_id}/change/")
        self.driver.find_element(By.ID, "close-link").click()
        wait_for(self.driver, "#recovery-form")
        self.driver.find_element(By.CSS_SELECTOR, f'input[name=outcome][value="{outcome}"]').click()
        if reference:
            self.driver.find_element(By.NAME, "reference").send_keys(reference)
        if reason:
            self.driver.find_element(By.NAME, "reason").send_keys(reason)
        self.driver.find_element(By.ID, "recovery-submit").click()
        return message(self.driver)

    def history(self, payout_id: str) -> str:
        self.open(f"{PAYOUT_ADMIN}/{payout_id}/history/")
        return self.driver.find_element(By.ID, "content").text


def test_an_operator_closes_the_books_after_duplicate_acks_and_timeouts(
    books_stack, browser, tmp_path
):
    stack = books_stack
    # The run: the rail duplicate-acks two payouts, books-then-drops one, drops one unbooked
    # (5 transfers of 700 on its statement).
    duplicated, booked_once, not_booked = bad_rail_day(stack, tmp_path, duplicate_acked=2)
    duplicates = {pid: transfers_of(stack, pid) for pid in duplicated}
    assert all(len(t) == 2 for t in duplicates.values()), duplicates
    assert all(len(transfers_of(stack, pid)) == 1 for pid in booked_once)
    assert all(transfers_of(stack, pid) == [] for pid in not_booked)

    code, report = reconcile(stack, tmp_path)
    assert code == 1 and len(report["violations"]["posted_has_one_booked_transfer"]) == 2
    assert scrape(stack)["reconcile_ok"] == 0.0

    posted_ref = dict(
        paydb(
            stack,
            "SELECT payout_id::text, rail_reference FROM payout WHERE payout_id::text = ANY(%s)",
            (duplicated,),
        )
    )
    extra = {
        pid: next(ref for ref, _ in t if ref != posted_ref[pid]) for pid, t in duplicates.items()
    }
    operator = Operator(browser, stack.start_admin().url)
    operator.log_in()

    # --- unsafe variants first: each refused, audited, nothing moved -------------------------
    books_before = paydb(stack, "SELECT count(*) FROM ledger_entry")[0][0]
    nb = not_booked[0]
    preselected, (level, text) = operator.resolve(nb, "the money surely left", to="POSTED")
    assert preselected == "FAILED"  # what NOT_BOOKED allows
    assert "error" in level and "needs classification BOOKED_ONCE" in text
    assert text.startswith(f"Payout {nb}")  # the id itself is never capitalised
    bo = booked_once[0]
    preselected, (level, text) = operator.resolve(bo, "customer says cancel it", to="FAILED")
    assert preselected == "POSTED" and "error" in level
    assert "record each as a rail recovery first" in text
    level, text = operator.record_by_hand("rail-not-on-any-statement", "made-up reference")
    assert "error" in level and "has not seen transfer rail-not-on-any-statement" in text
    first = duplicated[0]
    level, text = operator.record_by_hand(posted_ref[first], "the payout's own transfer")
    assert "error" in level and "the one payout" in text
    assert paydb(stack, "SELECT count(*) FROM ledger_entry")[0][0] == books_before
    assert states(stack, [nb, bo]) == {nb: "RAIL_AMBIGUOUS", bo: "RAIL_AMBIGUOUS"}
    assert "refused: resolve as POSTED" in operator.history(nb)

    # --- the safe way: every duplicate a recovery, every quarantined payout resolved ----------
    for pid, ref in extra.items():
        level, text = operator.record_from_payout_page(pid, ref, "rail duplicate ack (statement)")
        assert "success" in level and f"transfer {ref}" in text and "OPEN" in text
    assert scrape(stack)["rail_recoveries_open"] == 2.0
    level, text = operator.record_by_hand(extra[first], "the same duplicate again")
    assert "error" in level and "already has a recovery" in text
    # A stale form: the page is open while a colleague resolves the payout by command.
    ((bo_ref, _),) = transfers_of(stack, bo)
    operator.open(f"{QUARANTINE}/{bo}/resolve/")
    browser.find_element(By.NAME, "note").send_keys(f"statement shows {bo_ref} once")
    by_script = command(stack, "resolve_payout", bo, "--to", "POSTED", "--note", "by script")
    assert by_script.returncode == 0, by_script.stderr
    browser.find_element(By.ID, "resolve-submit").click()
    level, text = message(browser)
    assert "error" in level and f"resolved POSTED by {OPERATOR} at" in text
    assert f"reference {bo_ref}" in text and '"code"' not in browser.page_source
    for pid in booked_once[1:]:
        ((ref, _),) = transfers_of(stack, pid)
        preselected, (level, text) = operator.resolve(pid, f"statement shows {ref} once")
        assert preselected == "POSTED" and "success" in level and "resolved as POSTED" in text
    for pid in not_booked:
        preselected, (level, text) = operator.resolve(pid, "not on the rail's statement")
        assert preselected == "FAILED" and "success" in level and "resolved as FAILED" in text
    # Reopening the resolve page of a resolved payout: an admin page saying who and when.
    operator.open(f"{QUARANTINE}/{nb}/resolve/")
    level, text = message(browser)
    assert "error" in level and f"is FAILED: resolved FAILED by {OPERATOR} at" in text
    assert "NOT_FOUND" not in browser.page_source
    assert paydb(
        stack,
        "SELECT count(*) FROM operator_refusal WHERE action = 'resolve (stale form)'"
        " AND object_id = ANY(%s)",
        ([bo, nb],),
    ) == [(2,)]
    history = operator.history(bo)
    assert "resolved RAIL_AMBIGUOUS → POSTED" in history and OPERATOR in history

    recovery_ids = dict(paydb(stack, "SELECT rail_reference, recovery_id::text FROM rail_recovery"))
    recovered_ref, written_ref = extra[duplicated[0]], extra[duplicated[1]]
    level, text = operator.close(recovery_ids[recovered_ref], "RECOVERED", reference="ret-4711")
    assert "success" in level and "closed RECOVERED" in text
    level, text = operator.close(
        recovery_ids[written_ref], "WRITTEN_OFF", reason="beneficiary unreachable"
    )
    assert "success" in level and "closed WRITTEN_OFF" in text
    # Closing twice: the page no longer offers it; the URL by hand is refused.
    operator.open(f"{RECOVERIES}/{recovery_ids[written_ref]}/change/")
    assert not browser.find_elements(By.ID, "close-link")
    operator.open(f"{RECOVERIES}/{recovery_ids[written_ref]}/close/")
    browser.find_element(By.CSS_SELECTOR, 'input[name=outcome][value="RECOVERED"]').click()
    browser.find_element(By.NAME, "reference").send_keys("ret-again")
    browser.find_element(By.ID, "recovery-submit").click()
    level, text = message(browser)
    assert "error" in level and "already WRITTEN_OFF" in text

    # --- the commands refuse the same unsafe variants (exit 1 and the reason) ----------------
    again = command(
        stack,
        "record_rail_recovery",
        "--transfer",
        recovered_ref,
        "--reason",
        "once more, by script",
    )
    assert again.returncode == 1 and "already has a recovery" in again.stderr
    assert json.loads(again.stdout)["ok"] is False
    closed = command(
        stack,
        "close_rail_recovery",
        "--transfer",
        written_ref,
        "--written-off",
        "--reason",
        "twice by script",
    )
    assert closed.returncode == 1 and "already WRITTEN_OFF" in closed.stderr
    posted_again = command(stack, "resolve_payout", nb, "--to", "POSTED", "--note", "by script")
    assert posted_again.returncode == 1 and "not RAIL_AMBIGUOUS" in posted_again.stderr

    # --- the books agree with the statement --------------------------------------------------
    code, report = reconcile(stack, tmp_path)
    assert code == 0, report["violations"]
    assert report["ok"] is True and report["recoveries"] == {
        "OPEN": 0,
        "RECOVERED": 1,
        "WRITTEN_OFF": 1,
    }
    metrics = scrape(stack)
    assert metrics["reconcile_ok"] == 1.0
    assert metrics["rail_recoveries_open"] == 0.0
    assert metrics["rail_recovery_oldest_open_age_seconds"] == 0.0
    assert metrics['payout_backlog_oldest_age_seconds{state="PENDING"}'] == 0.0
    with psycopg.connect(stack.env["PAY_DATABASE_URL"], autocommit=True) as conn:
        drift = [books for books in account_books(conn.cursor()) if books[1] != books[2]]
    assert drift == []  # a settlement balance: its row plus its buckets
    statement_total = raildb(stack, "SELECT COALESCE(SUM(amount_minor), 0) FROM rail_transfer")[0][
        0
    ]
    legs = dict(
        (f"{account}:{direction}", int(total))
        for account, direction, total in paydb(
            stack,
            "SELECT account_id, direction, SUM(amount_minor) FROM ledger_entry"
            " WHERE account_id IN ('settlement:EUR', 'recoverable:rail:EUR', 'loss:rail:EUR')"
            " GROUP BY account_id, direction",
        )
    )
    balances = dict(
        paydb(
            stack,
            f"SELECT a.account_id, {balance_sql('a')} FROM account a WHERE a.account_id IN"
            " ('settlement:EUR', 'recoverable:rail:EUR', 'loss:rail:EUR')",
        )
    )
    # Every transfer that left was credited to settlement once: as a payout or as a recovery.
    assert legs["settlement:EUR:CREDIT"] == statement_total == 5 * 700
    # The receivable opened for both duplicates, and closed: one back, one to the loss account.
    assert legs["recoverable:rail:EUR:DEBIT"] == legs["recoverable:rail:EUR:CREDIT"] == 2 * 700
    assert balances["recoverable:rail:EUR"] == 0 and balances["loss:rail:EUR"] == -700
    # What left and stayed out = settlement; plus what came back = the statement's total.
    assert balances["settlement:EUR"] + legs["settlement:EUR:DEBIT"] == statement_total
    # Where the statement's money went: paid out for POSTED payouts, or a rail recovery that
    # came back (settlement debit), was written off (loss) or is still open (receivable).
    ((paid_out,),) = paydb(
        stack,
        "SELECT COALESCE(SUM(amount_minor), 0) FROM ledger_entry"
        " WHERE account_id = 'settlement:EUR' AND direction = 'CREDIT' AND payout_id IS NOT NULL",
    )
    assert paid_out == 3 * 700  # two duplicated payouts and the BOOKED_ONCE one
    assert (
        paid_out
        + legs["settlement:EUR:DEBIT"]
        - balances["loss:rail:EUR"]
        - balances["recoverable:rail:EUR"]
        == statement_total
    )
    # Every step left its audit: event rows and admin history on the recoveries and payouts.
    events = paydb(stack, "SELECT action, operator FROM rail_recovery_event ORDER BY id")
    assert sorted(a for a, _ in events) == ["RECORDED", "RECORDED", "RECOVERED", "WRITTEN_OFF"]
    assert {o for _, o in events} == {OPERATOR}
    assert uuid.UUID(recovery_ids[recovered_ref])
