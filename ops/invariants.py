"""The reconciler's invariants, one check each, over both books as read (ARCHITECTURE
decision 20): `Books.read` indexes paydb's snapshot and the rail's statement, `classify` gives
each payout its statement transfers and classification once, and `CHECKS` maps each invariant
(`Report.INVARIANTS`) to the function that returns its violations. Pure: no database here
(ops/reconciler.py reads and writes)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dlock.timefmt import rfc3339_ms

if TYPE_CHECKING:
    import datetime as dt


@dataclass
class Books:
    """Both books as read: paydb's snapshot and the rail's statement, indexed for the checks."""

    pay: dict[str, Any]
    rail: list[tuple[str, str, int, str, dt.datetime]]
    statement: dict[str, dict[str, Any]] = field(default_factory=dict)  # by rail reference
    order: dict[str, int] = field(default_factory=dict)  # rail reference -> position in time
    transfers: dict[str, list[str]] = field(default_factory=dict)  # by clientRef, in time order
    submissions: dict[str, list[tuple[str, str, str | None]]] = field(default_factory=dict)
    known_refs: set[str] = field(default_factory=set)  # clientRefs dlock submitted
    recovered: dict[str, set[str]] = field(default_factory=dict)  # by payout id

    @classmethod
    def read(cls, pay: dict[str, Any], rail: list[tuple]) -> Books:
        books = cls(pay=pay, rail=rail)
        transfers: dict[str, list[str]] = defaultdict(list)
        by_time = sorted(rail, key=lambda r: (r[4], r[1]))  # acceptedAt, then reference
        for order, (client_ref, ref, amount, currency, accepted_at) in enumerate(by_time):
            transfers[client_ref].append(ref)
            books.order[ref] = order
            books.statement[ref] = {
                "railReference": ref,
                "amountMinor": int(amount),
                "currency": currency,
                "acceptedAt": rfc3339_ms(accepted_at),
            }
        books.transfers = dict(transfers)
        subs: dict[str, list[tuple[str, str, str | None]]] = defaultdict(list)
        for payout_id, client_ref, outcome, ref in pay["submissions"]:
            subs[payout_id].append((client_ref, outcome, ref))
            books.known_refs.add(client_ref)
        books.submissions = dict(subs)
        recovered: dict[str, set[str]] = defaultdict(set)
        for ref, payout_id, _, _, _, _ in pay["recoveries"]:
            recovered[payout_id or ""].add(ref)
        books.recovered = dict(recovered)
        return books

    def refs_of(self, payout_id: str) -> list[str]:
        """The payout's transfers on the statement (by its submissions' clientRefs and its id),
        oldest first."""
        found = {
            ref
            for client_ref, _, _ in self.submissions.get(payout_id, [])
            for ref in self.transfers.get(client_ref, [])
        } | set(self.transfers.get(payout_id, []))
        return sorted(found, key=lambda r: self.order[r])


@dataclass(frozen=True)
class Payout:
    """One reconciled payout with its statement transfers (the per-payout checks' input)."""

    payout_id: str
    state: str
    posted_ref: str | None
    amount: int
    by_operator: bool
    classification: str
    refs: list[str]  # on the statement, oldest first
    covered: list[str]  # of those, the ones a rail recovery accounts for
    acked: int  # ACKED submissions

    @property
    def left(self) -> list[str]:
        return [r for r in self.refs if r not in self.covered]


def classify(books: Books) -> list[Payout]:
    found = []
    for payout_id, state, posted_ref, amount, _currency, by_operator in books.pay["payouts"]:
        submissions = books.submissions.get(payout_id, [])
        refs = books.refs_of(payout_id)
        if not submissions:
            classification = "NO_SUBMISSION"
        elif not refs:
            classification = "NOT_BOOKED"
        else:
            classification = "BOOKED_ONCE" if len(refs) == 1 else "BOOKED_MULTIPLE"
        covered = [r for r in refs if r in books.recovered.get(payout_id, set())]
        found.append(
            Payout(
                payout_id=payout_id,
                state=state,
                posted_ref=posted_ref,
                amount=int(amount),
                by_operator=by_operator,
                classification=classification,
                refs=refs,
                covered=covered,
                acked=sum(1 for s in submissions if s[1] == "ACKED"),
            )
        )
    return found


# One check per invariant (Report.INVARIANTS): each returns its violations.


def _balance_equals_ledger(books: Books, payouts: list[Payout]) -> list[dict[str, Any]]:
    return [
        {"accountId": account_id, "balanceMinor": int(balance), "ledgerSumMinor": int(ledger)}
        for account_id, balance, ledger in books.pay["accounts"]
        if int(balance) != int(ledger)
    ]


def _debits_equal_credits(books: Books, payouts: list[Payout]) -> list[dict[str, Any]]:
    debits, credits = books.pay["debits"], books.pay["credits"]
    return [] if debits == credits else [{"debitsMinor": debits, "creditsMinor": credits}]


def _posted_has_one_acked_submission(books: Books, payouts: list[Payout]) -> list[dict]:
    return [
        {"payoutId": p.payout_id, "ackedSubmissions": p.acked}
        for p in payouts
        if p.state == "POSTED" and p.acked != 1 and not (p.by_operator and p.posted_ref in p.refs)
    ]


def _posted_has_one_booked_transfer(books: Books, payouts: list[Payout]) -> list[dict]:
    found: list[dict[str, Any]] = []
    for p in payouts:
        if p.state != "POSTED":
            continue
        left = p.left
        if len(left) != 1 or (p.posted_ref is not None and left != [p.posted_ref]):
            found.append(
                {
                    "payoutId": p.payout_id,
                    "bookedTransfers": len(left),
                    "railReferences": left,
                    "recoveredReferences": p.covered,
                    "ownReference": p.posted_ref,
                }
            )
        elif books.statement[left[0]]["amountMinor"] != p.amount:
            found.append(
                {
                    "payoutId": p.payout_id,
                    "railReference": left[0],
                    "amountMinor": p.amount,
                    "statementAmountMinor": books.statement[left[0]]["amountMinor"],
                }
            )
    return found


def _failed_has_no_booked_transfer(books: Books, payouts: list[Payout]) -> list[dict]:
    """Money that left for a FAILED / ABANDONED payout must be a recorded recovery."""
    return [
        {"payoutId": p.payout_id, "state": p.state, "railReferences": p.left}
        for p in payouts
        if p.state in ("FAILED", "ABANDONED") and p.left
    ]


def _recovery_matches_statement(books: Books, payouts: list[Payout]) -> list[dict]:
    found = []
    for ref, payout_id, amount, currency, _status, _ in books.pay["recoveries"]:
        on_statement = books.statement.get(ref)
        if on_statement is None or (on_statement["amountMinor"], on_statement["currency"]) != (
            amount,
            currency,
        ):
            found.append(
                {
                    "railReference": ref,
                    "payoutId": payout_id,
                    "amountMinor": amount,
                    "currency": currency,
                    "statement": on_statement,
                }
            )
    return found


def _transfer_has_submission(books: Books, payouts: list[Payout]) -> list[dict]:
    return [
        {"clientRef": client_ref, "railReference": ref}
        for client_ref, refs in books.transfers.items()
        if client_ref not in books.known_refs
        for ref in refs
    ]


CHECKS: dict[str, Callable[[Books, list[Payout]], list[dict[str, Any]]]] = {
    "balance_equals_ledger": _balance_equals_ledger,
    "debits_equal_credits": _debits_equal_credits,
    "posted_has_one_acked_submission": _posted_has_one_acked_submission,
    "posted_has_one_booked_transfer": _posted_has_one_booked_transfer,
    "failed_has_no_booked_transfer": _failed_has_no_booked_transfer,
    "recovery_matches_statement": _recovery_matches_statement,
    "transfer_has_submission": _transfer_has_submission,
}
