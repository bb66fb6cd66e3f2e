"""Finding 4 of issue 26: the report reads the reconciler's classification after it ran."""

from __future__ import annotations

from experiment.arms.fenced import classified_after_reconcile


def test_the_quarantine_is_counted_by_the_classification_the_reconcile_just_gave():
    report = {
        "payouts": {
            "a": {"state": "RAIL_AMBIGUOUS", "classification": "NOT_BOOKED"},
            "b": {"state": "RAIL_AMBIGUOUS", "classification": "BOOKED_ONCE"},
            "c": {"state": "RAIL_AMBIGUOUS", "classification": "BOOKED_ONCE"},
            "d": {"state": "POSTED", "classification": "BOOKED_MULTIPLE"},
            "other-run": {"state": "RAIL_AMBIGUOUS", "classification": "NOT_BOOKED"},
        }
    }

    tally = classified_after_reconcile({"report": report}, ["a", "b", "c", "d"])

    assert tally == {"BOOKED_ONCE": 2, "NOT_BOOKED": 1}
    assert "UNCLASSIFIED" not in tally


def test_no_report_counts_nothing_rather_than_inventing_a_classification():
    assert classified_after_reconcile({"exit_code": 2, "output": "boom"}, ["a"]) == {}
