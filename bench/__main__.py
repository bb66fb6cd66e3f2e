"""`make bench` / `python -m bench`: the benchmarks docs/performance.md reports, in one run.

Parts (each writes `.run/bench/<name>.json` and returns a dict), by default: `bench.fsync` (the
disk), `bench.peers` (dlock beside ZooKeeper/kazoo and etcd's lock API, interleaved: the lock
table and its goal lines), `bench.e2e` (payouts end to end, CPU per payout by role, the
like-for-like floor). On request: `lockpath` (the lock path's CPU by layer), `etcd_paced`
(etcd's CPU per pair, dlock's etcd backend beside the bare recipe at one rate), `compare`
(`--before REV`: two trees' stacks; runs `transport`, their clients).
docs/performance.md says which part prints which of its tables. A part that is not built yet
is reported as missing; a part that fails is reported with its error; the others still run. The
summary (printed and written to `.run/bench/summary.json`) puts the numbers next to each other
and ends with the goal lines, PASS or FAIL (also `.run/bench/goals.json`). The table is
`bench.report`, the goals `bench.goals`; this module runs the parts.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import secrets
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench.goals import goals
from bench.report import summary_lines
from devstack.common import PROJECT

PARTS = ("fsync", "peers", "e2e")
OPTIONAL = ("compare", "lockpath", "transport", "etcd_paced")  # compare needs --before
MODULES = {name: f"bench.{name}" for name in (*PARTS, *OPTIONAL)}


def machine() -> dict:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "cpu": cpu,
        "mem_gb": mem_gb,
        "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
    }


# ----------------------------------------------------------------------------- main


def setup_django() -> None:
    """The harness itself reads payouts through payments' selectors (the e2e part imports the
    experiment's measuring code): Django is set up before any part is imported. The servers a part
    starts get their own environment and databases. The harness makes no Django database
    connection (selectors take the part's own cursor), so an unset URL points nowhere."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "settings.tooling")
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(48))
    for name in ("PAY_DATABASE_URL", "LOCK_DATABASE_URL", "RAIL_DATABASE_URL"):
        os.environ.setdefault(name, "postgres://bench@127.0.0.1:1/unused")
    import django

    django.setup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--out", type=Path, default=PROJECT / ".run" / "bench")
    parser.add_argument(
        "--only", nargs="*", choices=(*PARTS, *OPTIONAL), help="run only these parts"
    )
    parser.add_argument("--before", help="compare, transport: the revision before (e.g. 55d13fe)")
    parser.add_argument("--after", help="compare: the revision after (default: this tree)")
    args = parser.parse_args(argv)
    names = list(args.only or PARTS) + (["compare"] if args.before and not args.only else [])
    names += ["transport"] if "compare" in names and "transport" not in names else []
    if "compare" in names and not args.before:
        parser.error("compare needs --before <git revision>")
    setup_django()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}
    info = machine()
    print(
        f"[bench] {info['date']} on {info['cpus']} × {info['cpu']} ({info['mem_gb']} GB),"
        f" load average {info['loadavg_1m_at_start']}"
    )
    for name in names:
        started = time.monotonic()
        print(f"[bench] {name}: running…", flush=True)
        try:
            try:
                module = importlib.import_module(MODULES[name])
            except ModuleNotFoundError as exc:
                if exc.name != MODULES[name]:
                    raise
                results[name] = {"status": "missing", "error": f"{MODULES[name]} is not built yet"}
                print(f"[bench] {name}: missing ({MODULES[name]} not built yet)", flush=True)
                continue
            if name in ("compare", "transport"):
                result = module.run(out, before=args.before, after=args.after)
            else:
                result = module.run(out)
            results[name] = {"status": "ok", "result": result}
        except Exception as exc:
            results[name] = {
                "status": "failed",
                "error": f"{type(exc).__name__}: {exc}",
                "traceback": traceback.format_exc()[-3000:],
            }
            print(f"[bench] {name}: FAILED: {exc}", flush=True)
        results[name]["seconds"] = round(time.monotonic() - started, 1)
        print(f"[bench] {name}: {results[name]['status']} in {results[name]['seconds']} s")
    lines = summary_lines(results)
    text = "\n".join(lines)
    print(f"\n=== dlock bench summary ({info['date']}, {info['cpus']} CPUs, {info['cpu']}) ===")
    print(text)
    summary = {"machine": info, "parts": results, "table": lines, "goals": goals(results)}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    (out / "goals.json").write_text(json.dumps(summary["goals"], indent=2, default=str))
    info["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
    print(f"\n[bench] load average {info['loadavg_1m_at_start']} → {info['loadavg_1m_at_end']}")
    print(f"[bench] wrote {out}/*.json")
    failed = [n for n, r in results.items() if r["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
