"""The admin in its own role (issue 38 items 1, 2 and 5; ARCHITECTURE decision 22), against the
real topology: payment-resource and the admin each under gunicorn behind their own nginx, on one
paydb; the attacker on 127.0.0.2, the honest clients on 127.0.0.1 (both loopback).

* 16 concurrent log-in sprayers with fresh user names on the admin do not cost the money path a
  thing: while they are at it (checked causally, no wall-clock bound) an honest executor's claim
  and post on payments are answered, none 503. On the tree before the admin role, where the admin
  shared payment-resource's process, threads and database pool, they were 503 OVERLOADED.
* the nginx limit (429 envelope) and django-axes' locks by (name, address) and by address: a
  stranger failing the on-call's password from elsewhere never locks the on-call out; the
  spraying address is locked.
* `createsuperuser` and the django-axes unlock run exactly as the docs print them, from the
  stack's env file, with no proof ring anywhere in their environment.
"""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
import requests
from requests.adapters import HTTPAdapter

from devstack.common import PROJECT, PYTHON, free_port
from devstack.envfile import write_env
from devstack.roles import RoleProcess, manage
from devstack.secrets_env import role_environment, stack_file_env
from dlock import proof
from tests.conftest import _create_db
from tests.production.conftest import seed_payouts

pytestmark = [pytest.mark.live, pytest.mark.slow]

ATTACKER = "127.0.0.2"
SPRAYERS = 16
TIMEOUT = 30


class FromAddress(HTTPAdapter):
    """A requests adapter whose connections leave from `address` (another loopback address)."""

    def __init__(self, address: str) -> None:
        self.address = address
        super().__init__()

    def init_poolmanager(self, *args, **kwargs):
        kwargs["source_address"] = (self.address, 0)
        return super().init_poolmanager(*args, **kwargs)


def session_from(address: str) -> requests.Session:
    session = requests.Session()
    adapter = FromAddress(address)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session


def sql(db_url: str, statement: str, params: tuple = ()) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@pytest.fixture(scope="module")
def paydb():
    """A migrated paydb (migrated as `make up` does it: by the admin role, with no ring)."""
    db_url = _create_db(f"admin_role_{uuid.uuid4().hex[:10]}")
    env = {
        "PAY_DATABASE_URL": db_url,
        "DJANGO_SECRET_KEY": os.environ["DJANGO_SECRET_KEY"],
        "DJANGO_DEBUG": "false",
    }
    manage(["migrate", "--no-input", "-v", "0"], role_environment("admin", env), role="admin")
    return env


@pytest.fixture(scope="module")
def payments(paydb, tmp_path_factory):
    logdir = tmp_path_factory.mktemp("payments")
    proc = RoleProcess("payments", free_port(), paydb, logdir / "payments.log").start()
    yield proc
    proc.stop()


@pytest.fixture
def admin(paydb, tmp_path):
    """A fresh admin role (its own nginx, so its own per-address log-in budget)."""
    sql(paydb["PAY_DATABASE_URL"], "DELETE FROM axes_accessattempt")
    proc = RoleProcess(
        "admin",
        free_port(),
        role_environment("admin", paydb),
        tmp_path / "admin.log",
        inherit_environ=False,
    ).start()
    assert "DLOCK_PROOF_KEYS" not in proc.started_env
    assert "DLOCK_CREDENTIALS" not in proc.started_env
    yield proc
    proc.stop()


def seed(env: dict[str, str], payouts: int) -> tuple[str, list[str]]:
    seeded = seed_payouts(env, payouts=payouts, balance_minor=1_000_000)
    return seeded["accounts"][0], seeded["payouts"]


def make_staff(env: dict[str, str], user: str, password: str) -> None:
    manage(
        [
            "shell",
            "-c",
            "from django.contrib.auth.models import User; "
            f"User.objects.create_superuser({user!r}, password={password!r})",
        ],
        role_environment("admin", env),
        role="admin",
    )


def csrf_session(base: str, address: str = "127.0.0.1") -> requests.Session:
    session = session_from(address)
    page = session.get(f"{base}/admin/login/", timeout=TIMEOUT)
    assert page.status_code == 200, page.text[:500]
    return session


def log_in(session: requests.Session, base: str, user: str, password: str) -> requests.Response:
    return session.post(
        f"{base}/admin/login/?next=/admin/",
        data={
            "username": user,
            "password": password,
            "csrfmiddlewaretoken": session.cookies["csrftoken"],
        },
        headers={"Referer": f"{base}/admin/login/"},
        timeout=TIMEOUT,
        allow_redirects=False,
    )


class Sprayers:
    """SPRAYERS threads on ATTACKER, each with the log-in page's CSRF token, posting fresh user
    names as fast as they are answered until stopped; every answer counted by kind."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.stop = threading.Event()
        self.answers: Counter[str] = Counter()
        self.per_thread = [0] * SPRAYERS
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, args=(n,)) for n in range(SPRAYERS)]

    def total(self) -> int:
        with self.lock:
            return sum(self.answers.values())

    def kind(self, response: requests.Response) -> str:
        if response.status_code == 429 and response.headers["Content-Type"].startswith(
            "application/json"
        ):
            return "proxy-429"  # the nginx limit's envelope
        if response.status_code == 429:
            return "axes-429"  # django-axes' lockout page
        return str(response.status_code)

    def progress(self) -> list[int]:
        with self.lock:
            return list(self.per_thread)

    def run(self, n: int) -> None:
        with csrf_session(self.base, ATTACKER) as session:
            while not self.stop.is_set():
                reply = log_in(session, self.base, f"spray-{uuid.uuid4().hex[:12]}", "password1")
                with self.lock:
                    self.answers[self.kind(reply)] += 1
                    self.per_thread[n] += 1

    def __enter__(self) -> Sprayers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(TIMEOUT)


def honest_claim_and_post(url: str, db_url: str, account: str, payout: str, token: int) -> tuple:
    headers = {
        "X-Fencing-Token": str(token),
        "X-Fencing-Proof": proof.sign(key=proof.payout_key(account), token=token),
        "X-Owner-Id": "honest-executor",
        "X-Idempotency-Key": f"payout-{payout}",
    }
    claim = requests.post(
        f"{url}/v1/payouts/{payout}/claim",
        json={"expectedState": "PENDING"},
        headers=headers,
        timeout=TIMEOUT,
    )
    # The rail step (rail-proxy and the rail) is not this test's: its outcome, recorded.
    sql(db_url, "UPDATE payout SET state = 'RAIL_ACKED' WHERE payout_id = %s", (payout,))
    post = requests.post(
        f"{url}/v1/payouts/{payout}/post",
        json={"railReference": f"rr-{payout[:8]}", "submissionId": str(uuid.uuid4())},
        headers=headers,
        timeout=TIMEOUT,
    )
    return claim, post


def test_log_in_sprayers_on_the_admin_never_slow_the_money_path(paydb, payments, admin):
    db_url = paydb["PAY_DATABASE_URL"]
    account, payouts = seed(paydb, 12)
    with Sprayers(admin.url) as sprayers:
        # every sprayer has been answered at least once: all sixteen are at it
        while min(sprayers.progress()) == 0:
            time.sleep(0.01)
        started = sprayers.progress()
        for token, payout in enumerate(payouts, start=1):
            claim, post = honest_claim_and_post(payments.url, db_url, account, payout, token)
            assert claim.status_code == 200, claim.text
            assert post.status_code == 200, post.text
            assert post.json()["state"] == "POSTED"
        finished = sprayers.progress()
        alive = all(thread.is_alive() for thread in sprayers.threads)
        # causally: while the honest calls ran, every sprayer kept being answered (each one's
        # count grew between the first claim and the last post), and none had given up
        while min(b - a for a, b in zip(started, sprayers.progress(), strict=True)) == 0:
            time.sleep(0.01)
        overlapped = sum(b > a for a, b in zip(started, finished, strict=True))
    assert alive
    assert overlapped >= SPRAYERS // 2, (started, finished, sprayers.answers)
    assert sprayers.answers["proxy-429"] > 0, sprayers.answers  # the nginx limit
    assert sprayers.answers["axes-429"] > 0, sprayers.answers  # the address, locked
    # the admin may shed its own overload (503 OVERLOADED); it never fails
    assert not {"500", "502", "504"} & set(sprayers.answers), sprayers.answers
    # the spraying address is locked in django-axes (as an address, whatever the names)
    ((failures,),) = sql(
        db_url,
        "SELECT coalesce(sum(failures_since_start), 0) FROM axes_accessattempt "
        "WHERE ip_address = %s",
        (ATTACKER,),
    )
    assert failures >= 5
    # the proxy's own answer is the C3 envelope, with Retry-After
    with session_from(ATTACKER) as session:
        reply = session.post(f"{admin.url}/admin/login/", data={}, timeout=TIMEOUT)
    assert reply.status_code == 429
    assert reply.json()["code"] == "OVERLOADED" and reply.json()["retryAfterMillis"] > 0
    assert int(reply.headers["Retry-After"]) > 0
    # every lockout was counted (no name, no address in the series)
    metrics = requests.get(f"{admin.url}/metrics", timeout=TIMEOUT).text
    lockouts = re.search(r"^admin_lockouts_total (\S+)$", metrics, re.M)
    assert lockouts and float(lockouts.group(1)) >= sprayers.answers["axes-429"]


def test_a_stranger_never_locks_the_on_call_out_and_a_sprayer_is_locked(paydb, admin):
    db_url = paydb["PAY_DATABASE_URL"]
    on_call, password = f"oncall-{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    make_staff(paydb, on_call, password)

    # the stranger fails the on-call's password again and again from elsewhere, claiming to
    # be the on-call's address (the admin's nginx replaces a client's own X-Forwarded-For)
    with csrf_session(admin.url, ATTACKER) as stranger:
        stranger.headers["X-Forwarded-For"] = "127.0.0.1"
        statuses = [
            log_in(stranger, admin.url, on_call, f"guess-{n}").status_code for n in range(8)
        ]
        assert statuses[:4] == [200] * 4  # the form again, with its error
        assert statuses[4:] == [429] * 4  # the fifth failure locks: django-axes' lockout page
        # the address is locked, whatever the name: spraying other names gets nowhere
        assert log_in(stranger, admin.url, f"other-{uuid.uuid4().hex[:6]}", "x").status_code == 429

    # meanwhile the on-call, from their own address, logs in with the right password
    with csrf_session(admin.url) as mine:
        reply = log_in(mine, admin.url, on_call, password)
        assert reply.status_code == 302 and reply.headers["Location"] == "/admin/", reply.text
        assert mine.get(f"{admin.url}/admin/", timeout=TIMEOUT).status_code == 200

    rows = sql(
        db_url,
        "SELECT username, host(ip_address), failures_since_start FROM axes_accessattempt "
        "WHERE username = %s",
        (on_call,),
    )
    assert rows == [(on_call, ATTACKER, 5)]  # the address axes saw is the real client's


# --------------------------------------------------------------------------- as documented

OPERATIONS = PROJECT / "docs" / "operations.md"


def documented(command: str) -> str:
    """The exact command line docs/operations.md prints for `command` (`manage.py <command>`)."""
    pattern = re.compile(
        r"^\s*(set -a; \. \.run/stack\.env; set \+a; ROLE=admin \.venv/bin/python manage\.py "
        + re.escape(command)
        + r"\b.*)$",
        re.M,
    )
    match = pattern.search(OPERATIONS.read_text())
    assert match, f"docs/operations.md prints no ROLE=admin manage.py {command}"
    return match.group(1).strip().strip("`")


def run_as_printed(line: str, stack_env: Path, *answers: tuple[str, str]) -> tuple[int, str]:
    """`line` in bash from the project directory, with `.run/stack.env` replaced by the test's
    env file, on a terminal (createsuperuser prompts there); `answers`: (prompt, reply) pairs.
    The environment holds PATH and HOME only: nothing but the env file gives it settings."""
    line = line.replace(".run/stack.env", str(stack_env)).replace(".venv/bin/python", PYTHON)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        ["/bin/bash", "-c", line],
        cwd=PROJECT,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")},
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
    )
    os.close(slave)
    output = b""
    pending = list(answers)
    try:
        while True:
            ready, _, _ = select.select([master], [], [], TIMEOUT)
            if not ready:
                process.kill()
                raise AssertionError(f"no output for {TIMEOUT} s: {output.decode()[-2000:]}")
            try:
                chunk = os.read(master, 4096)
            except OSError:  # the terminal closed: the process exited
                break
            if not chunk:
                break
            output += chunk
            if pending and pending[0][0].encode() in output.rsplit(b"\n", 1)[-1]:
                os.write(master, pending.pop(0)[1].encode() + b"\n")
    finally:
        os.close(master)
    return process.wait(TIMEOUT), output.decode(errors="replace")


def test_createsuperuser_and_the_axes_unlock_work_exactly_as_documented(paydb, admin, tmp_path):
    stack_env = tmp_path / "stack.env"
    # what `make up` writes (.run/stack.env never holds the proof ring)
    write_env(stack_env, stack_file_env({**paydb, "ADMIN_URL": admin.url}))
    assert "DLOCK_PROOF_KEYS" not in stack_env.read_text()
    user, password = f"first-{uuid.uuid4().hex[:8]}", f"A-long-pass-{uuid.uuid4().hex[:12]}"

    code, out = run_as_printed(
        documented("createsuperuser"),
        stack_env,
        ("Username", user),
        ("Email address", ""),
        ("Password:", password),
        ("Password (again)", password),
    )
    assert code == 0 and "Superuser created successfully" in out, out
    assert "DLOCK_PROOF_KEYS" not in out

    # a stranger locks the name from 127.0.0.2; the documented unlock frees it at once
    with csrf_session(admin.url, ATTACKER) as stranger:
        for n in range(6):
            log_in(stranger, admin.url, user, f"guess-{n}")
        assert log_in(stranger, admin.url, user, password).status_code == 429
    for command, argument in (("axes_reset_username", user), ("axes_reset_ip", ATTACKER)):
        line = documented(command)
        line = re.sub(r"<[^>]+>", argument, line)
        code, out = run_as_printed(line, stack_env)
        assert code == 0, out
    with csrf_session(admin.url, ATTACKER) as again:
        reply = log_in(again, admin.url, user, password)
    assert reply.status_code == 302 and reply.headers["Location"] == "/admin/", reply.text

    code, out = run_as_printed(
        documented("changepassword").replace("<name>", user),
        stack_env,
        ("Password:", password + "-2"),
        ("Password (again)", password + "-2"),
    )
    assert code == 0 and "successfully" in out, out


def test_the_admin_answers_probes_by_pod_ip_and_refuses_foreign_hosts_elsewhere(admin):
    """Kubelet and Prometheus address the admin's pod by its IP, which no ALLOWED_HOSTS lists:
    health and metrics answer (Django's stock CommonMiddleware runs here); pages do not."""
    for path in ("/health/live", "/health/ready", "/metrics"):
        probe = requests.get(f"{admin.url}{path}", headers={"Host": "10.42.7.19:8080"}, timeout=5)
        assert probe.status_code == 200, (path, probe.text[:300])
    page = requests.get(f"{admin.url}/admin/login/", headers={"Host": "10.42.7.19:8080"}, timeout=5)
    assert page.status_code == 400
    errors = [line for line in admin.logfile.read_text().splitlines() if '"ERROR"' in line]
    assert errors == []


def test_payments_keeps_its_browsable_api_and_docs_and_serves_no_admin(payments):
    """payment-resource without any page middleware: DRF's browsable API on its GET endpoints
    and its docs pages still render (with their static files); the admin's paths are 404s."""
    page = requests.get(
        f"{payments.url}/v1/payouts?state=PENDING", headers={"Accept": "text/html"}, timeout=TIMEOUT
    )
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "/static/rest_framework/" in page.text and "Set-Cookie" not in page.headers
    css = requests.get(f"{payments.url}/static/rest_framework/css/bootstrap.min.css", timeout=5)
    assert css.status_code == 200
    for docs in ("/v1/docs", "/v1/redoc"):
        answer = requests.get(f"{payments.url}{docs}", timeout=TIMEOUT)
        assert answer.status_code == 200 and "'sha256-" in answer.headers["Content-Security-Policy"]
    for path in ("/admin/", "/admin/login/", "/static/admin/css/base.css"):
        refused = requests.get(f"{payments.url}{path}", timeout=TIMEOUT)
        assert refused.status_code == 404 and refused.json()["code"] == "NOT_FOUND", path
