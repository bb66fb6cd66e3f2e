"""A session's owning credential is written once and then kept per process: L2/L4/L5/L6 after
the first check of a session make no ownership round trip, and a foreign credential is still
refused."""

from __future__ import annotations

import uuid

import pytest

from dlock.auth import Principal
from dlock.errors import ApiError, Code
from dlock.memo import WriteOnceMap
from lockserver.ownership import check_owner, record_owner

pytestmark = pytest.mark.django_db(databases="__all__")

OWNER = Principal(credential_id="owner-cred-1", scopes=frozenset({"executor"}))
OTHER = Principal(credential_id="other-cred-2", scopes=frozenset({"executor"}))


def test_the_owner_is_read_once_then_kept_and_a_foreign_credential_is_still_refused(
    django_assert_num_queries,
):
    session_id = uuid.uuid4()
    record_owner(session_id=session_id, principal=OWNER)

    with django_assert_num_queries(1, using="lockdb"):
        check_owner(session_id=session_id, principal=OWNER)
    with django_assert_num_queries(0, using="lockdb"):
        check_owner(session_id=session_id, principal=OWNER)
        with pytest.raises(ApiError) as refused:
            check_owner(session_id=session_id, principal=OTHER)
    assert refused.value.code == Code.FORBIDDEN


def test_a_session_without_an_owner_record_is_read_again_each_time(django_assert_num_queries):
    session_id = uuid.uuid4()  # opened before owners were recorded: the backend alone judges

    with django_assert_num_queries(2, using="lockdb"):
        check_owner(session_id=session_id, principal=OWNER)
        check_owner(session_id=session_id, principal=OTHER)


def test_the_kept_map_is_bounded_oldest_out_first():
    kept = WriteOnceMap(limit=2)
    kept.remember("a", "1")
    kept.remember("b", "2")
    kept.remember("c", "3")

    assert (kept.get("a"), kept.get("b"), kept.get("c")) == (None, "2", "3")


def test_the_kept_map_evicts_in_insertion_order_through_heavy_churn():
    kept = WriteOnceMap(limit=100)
    for n in range(10_000):
        kept.remember(n, str(n))
    assert len(kept) == 100
    assert [kept.get(n) for n in (9_899, 9_900, 9_999)] == [None, "9900", "9999"]
