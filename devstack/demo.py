"""`make demo`: the main job. `make up` has started the stack; this runs a short fenced experiment.

Steps: check the stack (fail loudly, naming the missing piece) → `fencing_experiment --demo` in a
process of its own (the experiment is tooling above the dev stack, never imported by it): seed
accounts and payouts → run two real executor processes, four payouts in flight each, against a
slow, flaky, duplicate-acking rail while pausing (SIGSTOP past the lease), killing and restarting
workers and services → reconcile → print the report and where to look next (admin, browsable
API, /metrics, the JSON report).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devstack.common import PROJECT, PYTHON
from devstack.envfile import read_env, run_dir


def main() -> int:
    stack_env = run_dir() / "stack.env"
    env = read_env(stack_env)
    if not env:
        print(f"[dlock] demo cannot start: no {stack_env}: run `make up` first", file=sys.stderr)
        return 1
    out = Path(os.environ.get("DLOCK_DEMO_OUT", PROJECT / ".run" / "demo"))
    # `make experiment`'s environment: the harness reads payouts through payments' selectors and
    # pushes a revoke's floor through ops (Django models).
    child_env = {"ROLE": "ops", "DJANGO_SETTINGS_MODULE": "settings.tooling", **env, **os.environ}
    argv = [PYTHON, "-m", "django", "fencing_experiment", "--demo", "--out", str(out)]
    return subprocess.run(argv, cwd=PROJECT, env=child_env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
