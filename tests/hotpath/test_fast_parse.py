"""The rail submission's fast body check accepts exactly what SubmissionIn accepts, and yields
the same data; everything else is refused by the serializer itself (same details)."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import ValidationError

from railproxy.views import SubmissionIn, parse_submission
from railstub.views import SubmitIn, parse_transfer

PID = "0B4F8F0E-6A0E-4C1E-9C1E-3F1F0F7F7A01"
GOOD = {
    "payoutId": PID.lower(),
    "accountId": "acct-1",
    "amountMinor": 1_250,
    "currency": "EUR",
    "beneficiaryRef": "benef-1",
}


def body(**override):
    out = {**GOOD, **override}
    return {k: v for k, v in out.items() if v is not ...}


BODIES = [
    GOOD,
    body(payoutId=PID),
    body(payoutId=f" {PID}"),
    body(payoutId="not-a-uuid"),
    body(payoutId="0b4f8f0e6a0e4c1e9c1e3f1f0f7f7a01"),
    body(payoutId="{0b4f8f0e-6a0e-4c1e-9c1e-3f1f0f7f7a01}"),
    body(payoutId=5),
    body(accountId=""),
    body(accountId="   "),
    body(accountId="a" * 64),
    body(accountId="a" * 65),
    body(accountId="a\x00b"),
    body(accountId="kontó"),
    body(accountId=None),
    body(amountMinor=0),
    body(amountMinor=-1),
    body(amountMinor=1),
    body(amountMinor=2**63 - 1),
    body(amountMinor=2**63),
    body(amountMinor=2**70),
    body(amountMinor="100"),
    body(amountMinor=1.0),
    body(amountMinor=True),
    body(currency="eur"),
    body(currency="EURO"),
    body(currency="EU"),
    body(currency="ÉUR"),
    body(currency=" EU"),
    body(currency=978),
    body(beneficiaryRef=""),
    body(beneficiaryRef="b" * 128),
    body(beneficiaryRef="b" * 129),
    body(beneficiaryRef=" padded "),
    body(beneficiaryRef="\ud800"),
    body(beneficiaryRef=...),
    body(extra=1),
    {},
    [],
    "text",
    None,
]


def outcome(parse, data):
    try:
        return ("ok", dict(parse(data)))
    except ValidationError as exc:
        return ("refused", exc.detail)


def serializer(data):
    parsed = SubmissionIn(data=data)
    parsed.is_valid(raise_exception=True)
    return parsed.validated_data


@pytest.mark.parametrize("data", BODIES, ids=repr)
def test_submission_fast_path_matches_the_serializer(data):
    assert outcome(parse_submission, data) == outcome(serializer, data)


# -- the rail stub's transfer body (railstub.views.parse_transfer against SubmitIn) -----------

TRANSFER = {"clientRef": "payout-1:5000000001", "amountMinor": 990, "currency": "EUR"}


def transfer(**override):
    out = {**TRANSFER, **override}
    return {k: v for k, v in out.items() if v is not ...}


TRANSFERS = [
    TRANSFER,
    transfer(clientRef=""),
    transfer(clientRef=" "),
    transfer(clientRef=" padded "),
    transfer(clientRef="r" * 128),
    transfer(clientRef="r" * 129),
    transfer(clientRef="a\x00b"),
    transfer(clientRef="kontó"),
    transfer(clientRef="\ud800"),
    transfer(clientRef="line\u2028sep"),
    transfer(clientRef=7),
    transfer(clientRef=None),
    transfer(clientRef=...),
    transfer(amountMinor=0),
    transfer(amountMinor=-1),
    transfer(amountMinor=1),
    transfer(amountMinor=2**63 - 1),
    transfer(amountMinor=2**63),
    transfer(amountMinor="990"),
    transfer(amountMinor=990.0),
    transfer(amountMinor=True),
    transfer(amountMinor=None),
    transfer(currency="eur"),
    transfer(currency="EURO"),
    transfer(currency="EU"),
    transfer(currency="ÉUR"),
    transfer(currency="E1R"),
    transfer(currency=978),
    transfer(currency=...),
    transfer(extra=1),
    {},
    [],
    "text",
    None,
]


def transfer_serializer(data):
    parsed = SubmitIn(data=data)
    parsed.is_valid(raise_exception=True)
    return parsed.validated_data


@pytest.mark.parametrize("data", TRANSFERS, ids=repr)
def test_rail_stub_fast_path_matches_the_serializer(data):
    assert outcome(parse_transfer, data) == outcome(transfer_serializer, data)


# -- the common shape is derived from the serializer (dlock.serializers.common_shape) --------


@pytest.mark.parametrize(
    ("serializer_class", "bodies", "good"),
    [(SubmissionIn, BODIES, GOOD), (SubmitIn, TRANSFERS, TRANSFER)],
    ids=["SubmissionIn", "SubmitIn"],
)
def test_the_common_shape_never_accepts_what_the_serializer_refuses(serializer_class, bodies, good):
    from dlock.serializers import common_shape

    check = common_shape(serializer_class)
    assert check(dict(good)) is not None  # the hot body takes the derived path
    for data in bodies:
        common = check(data)
        if common is None:
            continue  # the serializer decides
        parsed = serializer_class(data=data)
        assert parsed.is_valid(), data
        assert common == dict(parsed.validated_data), data


def test_the_common_shape_refuses_to_guess_for_fields_it_does_not_know():
    from rest_framework import serializers

    from dlock.serializers import StrictBooleanField, StrictSerializer, common_shape

    class Flag(StrictSerializer):
        on = StrictBooleanField()

    class Pair(StrictSerializer):
        low = serializers.IntegerField()

        def validate(self, attrs):
            return attrs

    with pytest.raises(TypeError, match="on is a StrictBooleanField"):
        common_shape(Flag)
    with pytest.raises(TypeError, match="validates across fields"):
        common_shape(Pair)
