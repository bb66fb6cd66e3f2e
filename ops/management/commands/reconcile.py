"""`manage.py reconcile [--json] [--metrics-file PATH] [--no-write]` (ROLE=ops: paydb + raildb).

Detective control, never repairs: classifies SUBMITTING / RAIL_AMBIGUOUS payouts by the rail's
statement, writes `payout_reconciliation`, checks the ledger and rail invariants, prints a report
(or JSON), writes the counts as a Prometheus textfile, and exits 1 when an invariant is broken,
2 when it could not run: a database could not be read (no report, no textfile: "unknown" is not
"clean") or `--metrics-file` cannot be written (checked first: no verdict row is written).
`--exit-zero` (the Kubernetes CronJob): 0 on broken books too, the verdict being reconcile_ok.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from ops.reconciler import reconcile
from ops.report import metrics_text, render_text

if TYPE_CHECKING:
    import argparse


def _default_metrics_file() -> Path:
    return Path(settings.BASE_DIR) / ".run" / "metrics" / "reconcile.prom"


class Command(BaseCommand):
    help = "Reconcile paydb against the rail statement; exit 1 when an invariant is broken."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument(
            "--metrics-file", default=None, help="Prometheus textfile (default .run/metrics/)"
        )
        parser.add_argument(
            "--no-write", action="store_true", help="do not write payout_reconciliation rows"
        )
        parser.add_argument(
            "--exit-zero",
            action="store_true",
            help="exit 0 on broken books too (the verdict is the reconcile_ok metric; a "
            "scheduler's Job then fails only when the tool could not run)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = Path(options["metrics_file"]) if options["metrics_file"] else _default_metrics_file()
        _check_writable(path)  # before any read or verdict row: a bad path is no verdict
        try:
            report = reconcile(write=not options["no_write"])
        except DatabaseError as exc:
            cause = exc.__cause__ or exc
            raise CommandError(
                f"reconcile could not read the databases ({type(cause).__name__}: "
                f"{str(cause).strip().splitlines()[0] if str(cause).strip() else ''}); "
                "nothing was checked",
                returncode=2,
            ) from exc
        if options["json"]:
            self.stdout.write(json.dumps(report.as_dict(), indent=2, sort_keys=True))
        else:
            self.stdout.write(render_text(report))
        try:
            if path.exists() and not path.is_file():  # /dev/null, a FIFO: never replace it
                path.write_text(metrics_text(report))
            else:
                tmp = path.with_suffix(".tmp")
                tmp.write_text(metrics_text(report))
                tmp.replace(path)  # atomic for a textfile collector
        except OSError as exc:  # checked above; the disk filled or the path changed since
            raise CommandError(
                f"reconcile could not write --metrics-file {path}: {exc.strerror}; the verdict "
                "is recorded in paydb",
                returncode=2,
            ) from exc
        if not report.ok and not options["exit_zero"]:
            sys.exit(1)


def _check_writable(path: Path) -> None:
    """CommandError (exit 2) unless the textfile can be written: a regular file (or a new one)
    in a writable directory, or an existing non-directory special file (/dev/null, a FIFO)."""
    if path.is_dir():
        raise CommandError(f"--metrics-file {path} is a directory, not a file", returncode=2)
    if path.exists() and not path.is_file():
        if not os.access(path, os.W_OK):
            raise CommandError(f"--metrics-file {path} is not writable", returncode=2)
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(
            f"--metrics-file {path}: cannot create {path.parent}: {exc.strerror}", returncode=2
        ) from None
    if not path.parent.is_dir() or not os.access(path.parent, os.W_OK | os.X_OK):
        raise CommandError(f"--metrics-file {path}: {path.parent} is not writable", returncode=2)
    if path.exists() and not os.access(path, os.W_OK):
        raise CommandError(f"--metrics-file {path} is not writable", returncode=2)
