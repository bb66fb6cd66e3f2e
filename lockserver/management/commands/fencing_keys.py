"""`manage.py fencing_keys --new KID` / `--public [VALUE]`: make and share fencing-proof keys.

`--new KID` prints a fresh DLOCK_PROOF_KEYS entry (`KID:<Ed25519 private key>`): put it in
front of the lock server's DLOCK_PROOF_KEYS to rotate (docs/operations.md "Fencing-proof keys").
`--public` prints the DLOCK_FENCING_PUBLIC_KEYS value for a DLOCK_PROOF_KEYS value (the
argument, else this process's setting): what payment-resource, rail-proxy and adopters verify
with. Neither reads a database; `--new` needs no keys configured.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from dlock.fence.proofs import KeyFormatError, SigningKeys, new_signing_key

if TYPE_CHECKING:
    import argparse


class Command(BaseCommand):
    help = "Make a fencing-proof signing key, or print the public keys of a signing key set."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group(required=True)
        group.add_argument("--new", metavar="KID", help="print a fresh KID:<private key> entry")
        group.add_argument(
            "--public",
            nargs="?",
            const="",
            metavar="DLOCK_PROOF_KEYS",
            help="print DLOCK_FENCING_PUBLIC_KEYS for this value (default: the setting)",
        )

    def handle(self, *args: object, **options: object) -> None:
        try:
            if options["new"]:
                self.stdout.write(new_signing_key(str(options["new"])))
                return
            raw = str(options["public"] or "")
            keys = SigningKeys.parse(raw) if raw else settings.DLOCK_PROOF_KEYS
        except KeyFormatError as exc:
            raise CommandError(str(exc)) from None
        if not keys:
            raise CommandError("no DLOCK_PROOF_KEYS: pass the value or set the variable")
        self.stdout.write(keys.public().setting_value())
