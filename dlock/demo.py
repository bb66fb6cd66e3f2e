"""`make demo`: until the executor and experiment land, this only reports the running stack."""

from __future__ import annotations

import sys

from dlock.devstack import status


def main() -> int:
    print("[dlock] the stack is up; the fencing experiment is not built yet (issue 8).")
    return status()


if __name__ == "__main__":
    sys.exit(main())
