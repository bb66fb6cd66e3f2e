"""The payout's own idempotency key on P2/P3, the shared fenced-out signal and error shapes."""

from __future__ import annotations

import logging
import uuid

import pytest

from dlock import idempotency
from dlock.errors import ApiError, Code, allowed_statuses
from dlock.fence import refusals
from payments.models import IdempotencyRecord, Payout
from tests.payments import factories as f

pytestmark = pytest.mark.django_db(databases=["default"])

KEY_FIELD = [
    {"field": "X-Idempotency-Key", "message": "must be the payout's stable idempotencyKey"}
]


def _foreign_keys(p, other) -> list[str]:
    return ["k1", f"payout-{p.payout_id}-retry", other.idempotency_key]


def test_claim_with_a_foreign_idempotency_key_is_validation_failed_and_writes_nothing(client):
    acct = f.account()
    p, other = f.payout(acct), f.payout(acct)
    counted = f.fenced_count("account")
    for key in _foreign_keys(p, other):
        before = f.snapshot(p)

        response = f.claim(client, p, f.next_token(), key=key)

        assert response.status_code == 400, key
        body = response.json()
        assert body["code"] == "VALIDATION_FAILED" and body["retrySafe"] is False
        assert body["details"]["fields"] == KEY_FIELD
        assert f.snapshot(p) == before  # no fence move, no event, no idempotency record
    assert not IdempotencyRecord.objects.filter(idempotency_key__in=_foreign_keys(p, other))
    assert f.fenced_count("account") == counted
    # The payout's own key still claims it afterwards.
    assert f.claim(client, p, f.next_token()).status_code == 200


def test_post_with_a_foreign_idempotency_key_is_validation_failed_and_writes_nothing(client):
    acct = f.account(5_000)
    p, other = f.payout(acct, 1_000), f.payout(acct, 1_000)
    token = f.next_token()
    assert f.claim(client, p, token).status_code == 200
    f.rail_acked(p)
    for key in _foreign_keys(p, other):
        before = f.snapshot(p)

        response = f.post(client, p, token, key=key)

        assert response.status_code == 400, key
        assert response.json()["details"]["fields"] == KEY_FIELD
        assert f.snapshot(p) == before  # still RAIL_ACKED, no ledger legs, balance unchanged
    posted = f.post(client, p, token)
    assert posted.status_code == 200 and posted.json()["state"] == "POSTED"
    assert f.snapshot(p)["balance"] == 4_000


def test_a_foreign_key_with_a_stale_token_is_refused_for_the_key_and_not_counted_as_fenced(
    client, caplog
):
    acct = f.account()
    p, other = f.payout(acct), f.payout(acct)
    newer = f.next_token()
    assert f.claim(client, other, newer).status_code == 200
    counted = f.fenced_count("account")
    caplog.set_level(logging.INFO, logger="dlock.events")

    response = f.claim(client, p, newer - 1, key="k1")

    assert response.status_code == 400 and response.json()["code"] == "VALIDATION_FAILED"
    assert f.fenced_count("account") == counted
    assert not [r for r in caplog.records if getattr(r, "event", None) == "fenced_out"]


def test_a_foreign_key_on_an_unknown_payout_is_still_not_found(client):
    ghost = Payout(payout_id=uuid.uuid4(), idempotency_key="k-ghost")
    response = f.claim(client, ghost, f.next_token())
    assert response.status_code == 404 and response.json()["code"] == "NOT_FOUND"


def test_a_fenced_claim_logs_fenced_out_at_the_kits_one_level(client, caplog):
    acct = f.account()
    p, other = f.payout(acct), f.payout(acct)
    newer = f.next_token()
    assert f.claim(client, other, newer).status_code == 200
    caplog.set_level(logging.INFO, logger="dlock.events")

    assert f.claim(client, p, newer - 1).status_code == 409

    (event,) = [r for r in caplog.records if getattr(r, "event", None) == "fenced_out"]
    assert event.levelno == refusals.LOG_LEVEL == logging.WARNING


def test_a_fenced_post_counts_the_account_and_never_the_ledger(client):
    acct = f.account()
    p, other = f.payout(acct), f.payout(acct)
    old = f.next_token()
    assert f.claim(client, p, old).status_code == 200
    f.rail_acked(p)
    assert f.claim(client, other, f.next_token()).status_code == 200
    account_before = f.fenced_count("account")

    assert f.post(client, p, old).json()["code"] == "FENCED_OUT"

    assert f.fenced_count("account") - account_before == 1
    assert f.fenced_sample("ledger") == 0.0  # the series exists, and no write path reaches it
    assert f.fenced_sample("rail") is not None


def test_not_claimable_has_one_details_shape_on_claim_and_post(client):
    acct = f.account()
    claimed = f.payout(acct)
    token = f.next_token()
    assert f.claim(client, claimed, token).status_code == 200
    posted_early = f.post(client, claimed, token).json()
    refused = f.claim(client, f.payout(acct, state="POSTED"), f.next_token()).json()

    shape = {"payoutId", "state", "expectedStates", "claimToken", "presentedToken"}
    assert set(posted_early["details"]) == set(refused["details"]) == shape
    assert posted_early["details"] == {
        "payoutId": str(claimed.payout_id),
        "state": "CLAIMED",
        "expectedStates": ["RAIL_ACKED"],
        "claimToken": token,
        "presentedToken": token,
    }
    assert refused["details"]["claimToken"] is None


def test_status_overrides_come_only_from_the_catalogue():
    decline = ApiError(Code.VALIDATION_FAILED, "declined", http_status=422)
    assert decline.status == 422
    assert 422 in allowed_statuses(Code.VALIDATION_FAILED)
    with pytest.raises(ValueError):
        ApiError(Code.FENCED_OUT, "x", http_status=422)
    with pytest.raises(ValueError):
        ApiError(Code.NOT_FOUND, "x", http_status=405)
    with pytest.raises(ValueError):
        idempotency.recorded_error(418, {"code": "RAIL_AMBIGUOUS", "message": "m"})


@pytest.mark.parametrize("resource", ["", "Stock", "stock items", "s" * 33, "1stock"])
def test_the_fencing_kit_refuses_a_resource_type_that_is_no_metric_label(resource):
    with pytest.raises(ValueError):
        refusals.fenced_out(
            resource=resource, resource_id="p", presented=1, highest=2, owner_id="w"
        )


def test_an_adopters_resource_type_is_counted_under_its_own_label():
    before = f.fenced_count("stock")
    refused = refusals.fenced_out(
        resource="stock", resource_id="sku-1", presented=3, highest=4, owner_id="w"
    )
    assert isinstance(refused, refusals.FencedOut) and refused.status == 409
    assert (refused.presented_token, refused.highest_token) == (3, 4)
    assert f.fenced_count("stock") == before + 1


def test_a_recorded_error_replays_its_status_header_and_original_trace_id():
    envelope = ApiError(Code.RAIL_UNAVAILABLE, "down", details={"outcome": "NOT_SENT"}).envelope(
        "a" * 32
    )
    error = idempotency.recorded_error(503, envelope)
    assert (error.status, error.retry_after_ms, error.trace_id) == (503, 1_000, "a" * 32)
    assert error.headers == {"Idempotent-Replayed": "true"}
    assert error.envelope("a" * 32) == envelope


def test_the_request_hash_is_canonical():
    assert idempotency.request_hash({"b": 1, "a": [1, 2]}) == idempotency.request_hash(
        {"a": [1, 2], "b": 1}
    )
    assert idempotency.request_hash({"a": 1}) != idempotency.request_hash({"a": 2})
