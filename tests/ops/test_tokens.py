"""The issued-token bound repair_fence lowers fences to, read from each backend's real store."""

from __future__ import annotations

import pytest
from django.db import connections

from lockserver.backends.etcd.backend import EtcdLockBackend
from ops.tokens import etcd_issued_bound, highest_issued_token, pg_sequence_last
from tests.conftest import fresh_etcd
from tests.lockserver.test_etcd_tokens_and_outage import grant_and_release


@pytest.mark.django_db(databases=["default", "lockdb"])
def test_pg_bound_is_the_sequence_last_value_and_the_next_token_exceeds_it():
    with connections["lockdb"].cursor() as cursor:
        cursor.execute("SELECT nextval('fencing_token_seq')")
        (issued,) = cursor.fetchone()
        bound = pg_sequence_last()
        cursor.execute("SELECT nextval('fencing_token_seq')")
        (following,) = cursor.fetchone()
    assert bound == issued and following > bound


@pytest.mark.etcd
@pytest.mark.django_db(databases=["default", "lockdb"])
def test_etcd_bound_is_offset_plus_revision_covering_every_issued_token(settings):
    server = fresh_etcd()
    try:
        backend = EtcdLockBackend(
            url=server.url, prefix="ops-test/", token_floor=5_000, adopt_pg_sequence=False,
            housekeeping=False,
        )  # fmt: skip
        issued = grant_and_release(backend, 5)
        settings.ETCD_URL, settings.ETCD_PREFIX, settings.LOCK_BACKEND = (
            server.url, "ops-test/", "etcd",
        )  # fmt: skip

        bound = etcd_issued_bound()
        (following,) = grant_and_release(backend, 1)

        assert min(issued) > 5_000  # the offset is in force, so it must be read, not assumed 0
        assert max(issued) <= bound < following
        combined = highest_issued_token()
        assert combined.backend == "etcd" and combined.token >= bound
        assert set(combined.sources) == {"pgSequence", "etcdOffsetPlusRevision"}
    finally:
        server.stop()
