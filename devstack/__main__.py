"""`python -m devstack up|down|status|clean|restart NAME` (what the Makefile runs)."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from devstack.common import DEFAULT_PORTS, ROLES, URL_ENV, StackError, say
from devstack.stack import clean, down, restart_role, status, up


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack")
    parser.add_argument("command", choices=["up", "down", "status", "clean", "restart"])
    parser.add_argument("name", nargs="?", help="restart: the role instance, e.g. lockserver")
    parser.add_argument(
        "--backend",
        choices=["pg", "etcd"],
        default=os.environ.get("LOCK_BACKEND") or None,
        help="default: the running stack's, else pg",
    )
    parser.add_argument("--etcd-members", type=int, default=None, help="etcd cluster size")
    parser.add_argument("--replicas", type=int, default=None, help="replicas of each role")
    parser.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="https on every proxy, a throwaway CA (default: the running stack's, else off)",
    )
    parser.add_argument(
        "--port-base",
        type=int,
        default=None,
        help="roles on base+1..base+5 (default: the running stack's, else 8080 → 8081–8085)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            ports = None
            if args.port_base is not None:
                ports = {role: args.port_base + n for n, role in enumerate(ROLES, start=1)}
            env = up(
                args.backend,
                etcd_members=args.etcd_members,
                replicas=args.replicas,
                ports=ports,
                tls=args.tls,
            )
            say("stack is up:")
            for role in DEFAULT_PORTS:
                say(f"  {URL_ENV[role]:<16} {env[URL_ENV[role]]}")
            return 0
        if args.command == "down":
            down()
            return 0
        if args.command == "clean":
            clean()
            return 0
        if args.command == "restart":
            if not args.name:
                raise StackError("restart needs a role instance name, e.g. lockserver")
            proc = restart_role(args.name)
            say(f"{args.name} restarted on {proc.url}")
            return 0
        return status()
    except (StackError, subprocess.CalledProcessError) as exc:
        say(f"error: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
