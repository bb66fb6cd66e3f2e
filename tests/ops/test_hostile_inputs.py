"""The ops commands as an operator runs them (subprocesses of manage.py over real databases):
anything that is not a verdict or a refusal — a bad argument, a store that cannot be reached or
is misconfigured, the wrong ROLE — ends in one line on stderr and exit 2, never a traceback, and
writes nothing (no verdict row before the failure)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from devstack.common import free_port
from devstack.roles import manage
from tests.conftest import migrated_live_databases

pytestmark = [pytest.mark.live]


@pytest.fixture(scope="module")
def env():
    import os

    env = {
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DLOCK_PROOF_KEYS": os.environ["DLOCK_PROOF_KEYS"],
        "DJANGO_DEBUG": "false",
        "LOCK_BACKEND": "pg",
        **migrated_live_databases("h4hostile"),
    }
    with psycopg.connect(env["PAY_DATABASE_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO auth_user (username, password, is_staff, is_active, is_superuser,"
            " first_name, last_name, email, date_joined)"
            " VALUES ('oncall', '!', true, true, false, '', '', '', now())"
        )
    return env


def count(env: dict[str, str], table: str) -> int:
    with psycopg.connect(env["PAY_DATABASE_URL"]) as conn:
        return conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def run(env: dict[str, str], *args: str, role: str = "ops", **override: str | None):
    merged = {**env, **{k: v for k, v in override.items() if v is not None}}
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
    import os

    saved = {k: os.environ.pop(k) for k in override if override[k] is None and k in os.environ}
    try:
        return manage(args, merged, role=role, check=False, capture=True)
    finally:
        os.environ.update(saved)


def one_line_exit_2(result) -> str:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def dead_url() -> str:
    return f"postgres://nobody@127.0.0.1:{free_port()}/nothing"


def test_reconcile_with_a_directory_as_metrics_file_writes_no_verdict(env, tmp_path):
    before = count(env, "reconcile_run")
    line = one_line_exit_2(run(env, "reconcile", "--metrics-file", str(tmp_path)))
    assert "is a directory" in line
    assert count(env, "reconcile_run") == before
    ok = run(env, "reconcile", "--metrics-file", str(tmp_path / "r.prom"))
    assert ok.returncode == 0, ok.stderr
    assert count(env, "reconcile_run") == before + 1


def test_reconcile_with_a_database_url_that_is_no_url(env):
    line = one_line_exit_2(run(env, "reconcile", PAY_DATABASE_URL="notaurl"))
    assert "PAY_DATABASE_URL" in line


def test_reconcile_with_paydb_down(env, tmp_path):
    result = run(
        env, "reconcile", "--metrics-file", str(tmp_path / "r.prom"), PAY_DATABASE_URL=dead_url()
    )
    assert "could not" in one_line_exit_2(result)
    assert not (tmp_path / "r.prom").exists()


def test_rail_statement_with_raildb_down_or_unset(env):
    assert "could not" in one_line_exit_2(run(env, "rail_statement", RAIL_DATABASE_URL=dead_url()))
    assert "RAIL_DATABASE_URL" in one_line_exit_2(
        run(env, "rail_statement", RAIL_DATABASE_URL=None)
    )


def test_seed_payouts_with_a_balance_past_bigint_writes_nothing(env):
    before = count(env, "account")
    result = run(
        env,
        "seed_payouts",
        "--accounts",
        "1",
        "--payouts-per-account",
        "1",
        "--balance-minor",
        "99999999999999999999999",
        "--amount-minor",
        "1",
        role="payments",
    )
    assert "--balance-minor" in one_line_exit_2(result)
    assert count(env, "account") == before


def test_an_ops_command_under_another_role(env):
    assert "ROLE=ops" in one_line_exit_2(run(env, "reconcile", role="payments"))


def test_resolve_payout_with_no_uuid_is_a_bad_argument(env):
    before = count(env, "operator_refusal")
    result = run(
        env, "resolve_payout", "nope", "--to", "FAILED", "--note", "n", "--operator", "oncall"
    )
    assert "not a payout id" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_a_books_command_with_paydb_down(env):
    result = run(
        env,
        "record_rail_recovery",
        "--transfer",
        "RR-1",
        "--reason",
        "duplicate ack",
        "--operator",
        "oncall",
        PAY_DATABASE_URL=dead_url(),
    )
    assert "could not" in one_line_exit_2(result)


def test_an_unknown_operator_is_refused_with_a_record(env):
    before = count(env, "operator_refusal")
    result = run(
        env,
        "resolve_payout",
        str(uuid.uuid4()),
        "--to",
        "FAILED",
        "--note",
        "n",
        "--operator",
        "mallory",
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("CommandError: refused: no active")
    with psycopg.connect(env["PAY_DATABASE_URL"]) as conn:
        rows = conn.execute(
            "SELECT operator, known_user FROM operator_refusal ORDER BY id DESC LIMIT 1"
        ).fetchall()
    assert count(env, "operator_refusal") == before + 1 and rows == [("mallory", False)]


def test_written_off_with_a_reference_is_a_bad_argument_not_dropped(env):
    before = count(env, "operator_refusal")
    result = run(
        env,
        "close_rail_recovery",
        "--transfer",
        "RR-9",
        "--written-off",
        "--reason",
        "claim refused by rail",
        "--reference",
        "RET-9",
        "--operator",
        "oncall",
    )
    assert "WRITTEN_OFF takes no reference" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before  # a flag's rule broken: no audit row


def test_repair_fence_without_lockdb(env):

    seeded = run(
        env,
        "seed_payouts",
        "--accounts",
        "1",
        "--payouts-per-account",
        "0",
        "--balance-minor",
        "100",
        "--amount-minor",
        "1",
        "--json",
        role="payments",
    )
    account = json.loads(seeded.stdout)["accounts"][0]
    result = run(
        env,
        "repair_fence",
        "--account",
        account if isinstance(account, str) else account["accountId"],
        "--reason",
        "fence too high",
        LOCK_DATABASE_URL=None,
    )
    assert "LOCK_DATABASE_URL" in one_line_exit_2(result)


def test_revoke_lock_with_the_lock_server_unreachable_says_so_in_one_line(env):
    result = run(
        env,
        "revoke_lock",
        "payout:acct-1",
        "--operator",
        "oncall",
        "--reason",
        "stuck holder",
        LOCK_SERVER_URL=f"http://127.0.0.1:{free_port()}",
        DLOCK_OPERATOR_CREDENTIAL="x" * 32,
    )
    # not a verdict: exit 2 like every ops command (issue 40 item 3), not reached, nothing revoked
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    # the client's own JSON event (client_endpoint_demoted) precedes the one human line
    (line,) = [x for x in result.stderr.strip().splitlines() if not x.startswith("{")]
    assert line.startswith("CommandError: lock server not reached; nothing was revoked")


def test_rail_statement_json_is_camel_case_and_list_rail_recoveries_runs(env):
    statement = run(env, "rail_statement", "--json")
    assert statement.returncode == 0, statement.stderr
    assert set(json.loads(statement.stdout)["summary"]) >= {"transferCount", "clientRefCount"}
    listed = run(env, "list_rail_recoveries")
    assert listed.returncode == 0 and listed.stdout.startswith("0 rail recoveries, 0 OPEN")


def is_json(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def pending_payout(env: dict[str, str]) -> str:
    seeded = run(
        env,
        "seed_payouts",
        "--accounts", "1",
        "--payouts-per-account", "1",
        "--balance-minor", "1000",
        "--amount-minor", "100",
        "--json",
        role="payments",
    )  # fmt: skip
    assert seeded.returncode == 0, seeded.stderr
    return json.loads(seeded.stdout)["payouts"][0]


def test_resolve_payout_of_a_payout_that_exists_nowhere_is_exit_2_without_an_audit_row(env):
    before = count(env, "operator_refusal")
    nowhere = str(uuid.uuid4())
    result = run(
        env, "resolve_payout", nowhere, "--to", "FAILED", "--note", "n", "--operator", "oncall"
    )
    assert f"no payout {nowhere}" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_reverse_payout_of_a_payout_that_exists_nowhere_is_exit_2_without_an_audit_row(env):
    before = count(env, "operator_refusal")
    result = run(
        env,
        "reverse_payout", str(uuid.uuid4()),
        "--reason", "statement lacks it",
        "--operator", "oncall",
    )  # fmt: skip
    assert "no payout" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_close_recovered_without_a_reference_is_exit_2_without_an_audit_row(env):
    before = count(env, "operator_refusal")
    result = run(
        env, "close_rail_recovery", "--transfer", "RR-7", "--recovered", "--operator", "oncall"
    )
    assert "--reference" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_close_of_a_transfer_with_no_recovery_is_exit_2_without_an_audit_row(env):
    before = count(env, "operator_refusal")
    result = run(
        env,
        "close_rail_recovery", "--transfer", "RR-nowhere",
        "--recovered", "--reference", "RET-1",
        "--operator", "oncall",
    )  # fmt: skip
    assert "no rail recovery for transfer 'RR-nowhere'" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_a_short_reason_is_exit_2_without_an_audit_row_even_for_an_unknown_operator(env):
    before = count(env, "operator_refusal")
    result = run(
        env, "record_rail_recovery", "--transfer", "RR-8", "--reason", "dup", "--operator", "eve"
    )
    assert "at least 8 characters" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_a_plan_with_a_bad_line_closes_nothing_and_records_nothing(env, tmp_path):
    before = count(env, "operator_refusal")
    plan = tmp_path / "plan.txt"
    plan.write_text("# bad day\nRR-1 RECOVERED RET-1\nRR-2 RECOVERED\n")
    result = run(env, "close_rail_recovery", "--all-from-file", str(plan), "--operator", "oncall")
    assert f"{plan}:3" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before


def test_a_refusal_prints_only_human_lines_and_its_event_goes_to_the_events_log(env, tmp_path):
    """The terminal gets the command's one human line; the JSON event goes to the events log,
    or to the terminal when --log-json asks."""
    payout = pending_payout(env)
    log = tmp_path / "events.log"
    args = ("resolve_payout", payout, "--to", "FAILED", "--note", "checked the statement")

    result = run(env, *args, "--operator", "oncall", DLOCK_EVENTS_LOG=str(log))

    assert result.returncode == 1, result.stderr
    lines = (result.stdout + result.stderr).strip().splitlines()
    assert lines == [f"CommandError: refused: payout {payout} is PENDING, not RAIL_AMBIGUOUS"]
    (event,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert (event["event"], event["payoutId"], event["level"]) == (
        "payout_resolution_refused",
        payout,
        "WARNING",
    )

    asked = run(env, *args, "--operator", "oncall", "--log-json", DLOCK_EVENTS_LOG=str(log))

    assert asked.returncode == 1
    events = [json.loads(x) for x in asked.stderr.splitlines() if is_json(x)]
    assert [e["event"] for e in events] == ["payout_resolution_refused"]
    assert len(log.read_text().splitlines()) == 1  # this run's event went to the terminal


def test_an_unknown_operators_refusal_is_one_human_line_too(env, tmp_path):
    result = run(
        env,
        "reverse_payout", str(uuid.uuid4()),
        "--reason", "statement lacks it",
        "--operator", "mallory",
        DLOCK_EVENTS_LOG=str(tmp_path / "events.log"),
    )  # fmt: skip
    assert result.returncode == 1
    assert not [x for x in (result.stdout + result.stderr).splitlines() if is_json(x)]
    assert "operator_refused" in (tmp_path / "events.log").read_text()


def test_an_ops_command_under_another_role_is_named_before_any_setting_check(env):
    line = one_line_exit_2(
        run(env, "reconcile", role="payments", DLOCK_PROOF_KEYS=None, DJANGO_SECRET_KEY=None)
    )
    assert "ROLE=ops" in line
    assert "DLOCK_PROOF_KEYS" not in line and "DJANGO_SECRET_KEY" not in line


@pytest.mark.parametrize(
    ("role", "args", "event"),
    [
        ("payments", ("purge_idempotency", "--dry-run"), "idempotency_purged"),
        ("admin", ("axes_reset_ip", "127.0.0.9"), "log"),
    ],
    ids=["ROLE=payments purge_idempotency", "ROLE=admin axes_reset_ip"],
)
def test_an_operator_command_under_a_server_role_prints_only_human_lines(
    env, tmp_path, role, args, event
):
    """The retention purge (also ROLE=payments) and django-axes' unlocks (ROLE=admin) are
    operator commands too: their JSON lines go to the events log, not the terminal."""
    log = tmp_path / "events.log"
    result = run(env, *args, role=role, DLOCK_EVENTS_LOG=str(log))
    assert result.returncode == 0, result.stderr
    terminal = (result.stdout + result.stderr).splitlines()
    assert terminal and not [x for x in terminal if is_json(x)], terminal
    assert event in [json.loads(line)["event"] for line in log.read_text().splitlines()]


def test_a_failed_resolution_with_a_reference_is_a_bad_argument(env):
    """A reference is the statement's of a POSTED resolution: with FAILED it means nothing, so
    it is refused as a bad argument before anything is read or recorded."""
    before = count(env, "operator_refusal")
    payout = pending_payout(env)
    result = run(
        env,
        "resolve_payout", payout, "--to", "FAILED", "--reference", "RR-X",
        "--note", "checked the statement", "--operator", "oncall",
    )  # fmt: skip
    assert "--reference" in one_line_exit_2(result)
    assert count(env, "operator_refusal") == before
