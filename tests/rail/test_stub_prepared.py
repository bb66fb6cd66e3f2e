"""The rail stub's two per-request statements are prepared once per pooled connection."""

from __future__ import annotations

import uuid

import pytest
from django.db import connections

from railstub import services
from railstub.models import RailRequest, RailTransfer

pytestmark = pytest.mark.django_db(databases=["default", "raildb"])


def test_the_stubs_config_read_and_booking_are_prepared_statements():
    client_ref = f"ref-{uuid.uuid4()}"
    decision = services.Decision(services.Fault.OK, duplicate_ack=False)
    bookings = []
    for _ in range(3):  # psycopg prepares a statement the second time it runs on a connection
        services.load_config()
        bookings.append(
            services.record_call(
                client_ref=client_ref, amount_minor=990, currency="EUR", decision=decision
            )
        )
    with connections["raildb"].cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        prepared = [" ".join(text.split()) for (text,) in cursor.fetchall()]
    assert any("FROM railstub_config WHERE id = 1" in text for text in prepared), prepared
    assert any("INSERT INTO rail_transfer" in text for text in prepared), prepared
    # The books are exactly as before: every call booked, the repeats pointing at the first.
    transfers = list(
        RailTransfer.objects.using("raildb")
        .filter(client_ref=client_ref)
        .order_by("accepted_at", "rail_reference")
    )
    assert [t.rail_reference for t in transfers] == [b.rail_reference for b in bookings]
    assert [t.duplicate_of for t in transfers] == [None] + [bookings[0].rail_reference] * 2
    assert [t.amount_minor for t in transfers] == [990, 990, 990]
    logged = RailRequest.objects.using("raildb").filter(client_ref=client_ref)
    assert sorted(r.fault for r in logged) == ["ok", "ok", "ok"]
