"""`manage.py run_executor --owner-id ID [--concurrency N] [--max-payouts N] [--until-idle]`.

`--metrics-port` (default: EXECUTOR_METRICS_PORT, 0 = off) serves /metrics from start-up to
exit; `--metrics-linger-s` keeps serving that long after a `--until-idle` run is done, so a
short run's final counters still reach a scrape (Prometheus scrapes every 15-30 s).

The payout worker (ROLE=executor: no database, HTTP only). Steps are in `executor.section`.
SIGTERM/SIGINT stop taking payouts; the current section finishes or is safely abandoned, the
grant is released, the session closed, and the process exits 0.

A peer whose TLS certificate cannot be verified (DLOCK_CA_BUNDLE, else the system store) is a
misconfiguration, not an outage to wait out: the command exits 1 at start-up with one line
naming the URL and the reason.
"""

from __future__ import annotations

import signal
import ssl
import sys
import threading
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dlock import lifecycle
from dlock.headers import validate_owner_id
from dlock.http import TransportError, send_once
from executor.pause import PausePlan
from executor.worker import Executor
from settings.env import env_int

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Drain PENDING payouts: lock → claim → submit → post → release, one grant per payout."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--owner-id", required=True, help="worker identity (≤64 chars)")
        parser.add_argument("--max-payouts", type=int, default=None)
        parser.add_argument("--until-idle", action="store_true", help="exit when nothing is left")
        parser.add_argument(
            "--idle-timeout-s",
            type=float,
            default=30.0,
            help="with --until-idle: give up after this long without progress",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=settings.EXECUTOR_CONCURRENCY,
            help="payouts in flight at once, each on its own account (default "
            "EXECUTOR_CONCURRENCY, 1)",
        )
        parser.add_argument(
            "--drain-budget-s",
            type=float,
            default=settings.EXECUTOR_DRAIN_BUDGET_S,
            help="on SIGTERM, how long in-flight sections may take to finish or abandon",
        )
        parser.add_argument(
            "--metrics-port", type=int, default=env_int("EXECUTOR_METRICS_PORT", 0, minimum=0)
        )
        parser.add_argument(
            "--metrics-linger-s",
            type=float,
            default=float(env_int("EXECUTOR_METRICS_LINGER_S", 0, minimum=0)),
        )
        parser.add_argument("--metrics-addr", default="0.0.0.0")  # noqa: S104 - scraped in-pod
        parser.add_argument("--lock-ttl-ms", type=int, default=settings.LOCK_DEFAULT_TTL_MS)
        parser.add_argument("--session-ttl-ms", type=int, default=settings.LOCK_SESSION_TTL_MS)

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            owner_id = validate_owner_id(options["owner_id"])
            pause = PausePlan.from_env()
        except Exception as exc:
            raise CommandError(str(exc)) from exc
        if options["max_payouts"] is not None and options["max_payouts"] < 1:
            raise CommandError("--max-payouts must be at least 1")
        if options["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        if options["drain_budget_s"] <= 0:
            raise CommandError("--drain-budget-s must be positive")
        unverifiable = _unverifiable_peer(
            settings.LOCK_SERVER_URL, settings.PAYMENTS_URL, settings.RAIL_PROXY_URL
        )
        if unverifiable:
            raise CommandError(unverifiable)
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"], addr=options["metrics_addr"])
        executor = Executor(
            owner_id=owner_id,
            lock_url=settings.LOCK_SERVER_URL,
            payments_url=settings.PAYMENTS_URL,
            rail_proxy_url=settings.RAIL_PROXY_URL,
            lock_ttl_ms=options["lock_ttl_ms"],
            session_ttl_ms=options["session_ttl_ms"],
            pause=pause,
            concurrency=options["concurrency"],
            drain_budget_s=options["drain_budget_s"],
        )
        signal.signal(signal.SIGTERM, executor.request_stop)
        signal.signal(signal.SIGINT, executor.request_stop)
        lifecycle.started_command(
            "run_executor",
            ownerId=owner_id,
            concurrency=options["concurrency"],
            lockServerUrl=settings.LOCK_SERVER_URL,
            paymentsUrl=settings.PAYMENTS_URL,
            railProxyUrl=settings.RAIL_PROXY_URL,
            metricsPort=options["metrics_port"] or None,
        )
        code = executor.run(
            max_payouts=options["max_payouts"],
            until_idle=options["until_idle"],
            idle_timeout_s=options["idle_timeout_s"],
        )
        lifecycle.stopped_command("run_executor", exitCode=code or 0)
        if options["metrics_port"] and options["metrics_linger_s"] > 0:
            done = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: done.set())
            signal.signal(signal.SIGINT, lambda *_: done.set())
            done.wait(options["metrics_linger_s"])  # a SIGTERM still ends it at once
        if code:
            sys.exit(code)  # --until-idle left backed-off payouts (named in the last log line)


def _unverifiable_peer(*urls: str) -> str | None:
    """Why one https endpoint among `urls` (each a comma-separated list) cannot be trusted, or
    None. A peer that does not answer is an outage the run waits out; a certificate that does
    not verify never gets better by waiting."""
    for endpoint in (u.strip() for url in urls for u in url.split(",")):
        if not endpoint.startswith("https://"):
            continue
        try:
            send_once(
                "GET",
                f"{endpoint.rstrip('/')}/health/live",
                connect_s=5.0,
                read_s=5.0,
                body=b"",
                headers={},
            )
        except TransportError as exc:
            if isinstance(exc.cause, ssl.SSLError):
                reason = getattr(exc.cause, "verify_message", None) or str(exc.cause)
                return f"cannot verify the TLS certificate of {endpoint}: {reason}"
    return None
