"""Tests of the streamux codec and negotiation (:mod:`polymux.wire.streamux`).

Expected values are derived by hand from the 2019-06-04 specification
(``/work/shared/specs/streamux.md``) and PROTOCOL-NOTES A4, not produced by the code under test:

* the initialize message is 5 bytes: byte 0 the protocol version, then a big-endian 32-bit word,
  most significant bit first: 2 reserved bits (0), quick-init request, quick-init allowed,
  id min (4 bits), id max (5), id recommended (5), length min (4), length max (5), length
  recommended (5); 31 is the "wildcard" recommended value;
* negotiation: min = max of the mins, max = min of the maxes (fail if max < min),
  recommended = min of both (a wildcard defers to the other; both wildcards: the midpoint
  rounded up), value = clamp(recommended, min, max); then if id + length > 30: both over 15
  become 15, else the larger becomes 30 - the smaller; quick init: the requester's recommended
  values win (and must lie inside the negotiated range);
* a chunk header is a little-endian integer of 1/2/3/4 bytes for id + length bits of 1-6 /
  7-14 / 15-22 / 23-30; from the least significant bit: termination, response, length, id;
  unused high bits must be 0.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from itertools import pairwise, product

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import polymux
from polymux.exceptions import ProtocolError
from polymux.wire.streamux import (
    PROTOCOL_VERSION,
    WILDCARD,
    Chunk,
    Decoder,
    InitMessage,
    Negotiated,
    NegotiationError,
    decode_init,
    encode_header,
    encode_init,
    negotiate,
)


def h(text: str) -> bytes:
    """Hex (spaces allowed) to bytes."""
    return bytes.fromhex(text)


def body(n: int) -> bytes:
    """A recognisable payload of ``n`` bytes."""
    return (bytes(range(251)) * (n // 251 + 1))[:n]


def norm(chunks: list[Chunk]) -> list[Chunk]:
    """Chunks with their (memoryview) payloads turned into bytes, for plain comparison."""
    return [c._replace(payload=bytes(c.payload)) for c in chunks]


def msg(
    ids: tuple[int, int, int] = (1, 29, 14),
    lengths: tuple[int, int, int] = (6, 30, 16),
    *,
    qr: bool = False,
    qa: bool = False,
    version: int = 1,
) -> InitMessage:
    """An initialize message from (min, max, recommended) triples."""
    return InitMessage(version, qr, qa, *ids, *lengths)


def both_orders(a: InitMessage, b: InitMessage) -> Negotiated:
    """Negotiate as each peer; both must reach the same result."""
    ab = negotiate(a, b)
    ba = negotiate(b, a)
    assert ab == ba
    return ab


def both_orders_fail(a: InitMessage, b: InitMessage, needles: list[str]) -> None:
    """Negotiation fails for both peers, and the message names the reason."""
    for us, them in ((a, b), (b, a)):
        with pytest.raises(NegotiationError) as info:
            negotiate(us, them)
        err = info.value
        assert isinstance(err, polymux.ProtocolError)
        assert err.format == "streamux"
        assert str(err).startswith("streamux: negotiation failed: ")
        for needle in needles:
            assert needle in err.detail, (needle, err.detail)


# -- negotiation: the spec's examples ------------------------------------------------------

# (case, peer A, peer B, (id bits, length bits)) from "Negotiation Examples".
EXAMPLES = [
    pytest.param(msg((6, 12, 8), (6, 20, 14)), msg((6, 15, 7), (5, 15, 15)), (7, 14), id="all-compatible"),
    # Length: both wildcards over 15..18 -> 17; 14 + 17 > 30 -> length = 30 - 14 = 16.
    pytest.param(
        msg((6, 16, 14), (6, 20, WILDCARD)),
        msg((6, 18, 15), (15, 18, WILDCARD)),
        (14, 16),
        id="wildcard-total-over-30",
    ),
    # Id: (16 - 6) / 2 + 6 = 11; length: (15 - 8) / 2 + 8 rounded up = 12.
    pytest.param(
        msg((6, 16, WILDCARD), (6, 20, WILDCARD)),
        msg((6, 18, WILDCARD), (8, 15, WILDCARD)),
        (11, 12),
        id="all-wildcard",
    ),
    pytest.param(
        msg((8, 15, 8), (10, 18, 14), qr=True),
        msg((6, 18, 10), (8, 15, 10), qa=True),
        (8, 14),
        id="quick-init",
    ),
    pytest.param(
        msg((8, 15, 8), (10, 18, 14)),
        msg((6, 18, 10), (8, 15, 10), qa=True),
        (8, 10),
        id="quick-allowed-not-requested",
    ),
]

FAILED_EXAMPLES = [
    pytest.param(
        msg((6, 8, 8), (5, 12, 12)),
        msg((10, 15, 10), (5, 15, 15)),
        ["id bits", "max 8 < min 10"],
        id="max-id-below-min-id",
    ),
    # Peer A's recommended length (16) is above peer B's max (15).
    pytest.param(
        msg((8, 15, 8), (10, 18, 16), qr=True),
        msg((6, 18, 10), (8, 15, 10), qa=True),
        ["quick init", "length bits 16", "10..15"],
        id="quick-init-unsupported-values",
    ),
]


@pytest.mark.parametrize(("a", "b", "expected"), EXAMPLES)
def test_spec_negotiation_examples(a: InitMessage, b: InitMessage, expected: tuple[int, int]) -> None:
    a.check()
    b.check()
    assert both_orders(a, b) == Negotiated(*expected)
    # what each peer sends survives the wire
    assert both_orders(decode_init(encode_init(a)), decode_init(encode_init(b))) == Negotiated(*expected)


@pytest.mark.parametrize(("a", "b", "needles"), FAILED_EXAMPLES)
def test_spec_negotiation_failures(a: InitMessage, b: InitMessage, needles: list[str]) -> None:
    a.check()  # each message is valid on its own
    b.check()
    both_orders_fail(a, b, needles)


def test_negotiation_error_is_a_protocol_error() -> None:
    assert issubclass(NegotiationError, ProtocolError)
    assert issubclass(NegotiationError, polymux.ProtocolError)
    err = NegotiationError("why")
    assert err.format == "streamux"
    assert err.detail == "negotiation failed: why"


# -- negotiation: further rules --------------------------------------------------------------

RULES = [
    # both over 15 -> 15 / 15
    pytest.param(
        msg((0, 29, 20), (1, 30, 20)), msg((0, 29, 22), (1, 30, 25)), (15, 15), id="cap-both-over-15"
    ),
    # id 10 + length 25 -> length = 30 - 10
    pytest.param(msg((0, 29, 10), (1, 30, 25)), msg((0, 29, 12), (1, 30, 27)), (10, 20), id="cap-length"),
    # id 29 + length 5 -> id = 30 - 5
    pytest.param(msg((0, 29, 29), (1, 30, 5)), msg((0, 29, 29), (1, 30, 9)), (25, 5), id="cap-id"),
    # exactly 30 is not capped
    pytest.param(msg((0, 29, 14), (1, 30, 16)), msg((0, 29, 29), (1, 30, 30)), (14, 16), id="exactly-30"),
    pytest.param(msg((0, 0, 0), (1, 30, 30)), msg((0, 29, 9), (1, 30, 30)), (0, 30), id="id-0-length-30"),
    pytest.param(msg((0, 29, 29), (1, 1, 1)), msg((0, 29, 29), (1, 30, 8)), (29, 1), id="id-29-length-1"),
    # both wildcards over 1..30: (30 - 1) / 2 = 14.5 -> 15, + 1 = 16; over 0..29: 14.5 -> 15
    pytest.param(
        msg((0, 29, WILDCARD), (1, 30, WILDCARD)),
        msg((0, 29, WILDCARD), (1, 30, WILDCARD)),
        (15, 15),
        id="midpoint-rounds-up-then-cap",
    ),
    pytest.param(
        msg((3, 8, WILDCARD), (2, 5, WILDCARD)),
        msg((0, 29, WILDCARD), (1, 30, WILDCARD)),
        (6, 4),  # (8-3)/2 = 2.5 -> 3, + 3; (5-2)/2 = 1.5 -> 2, + 2
        id="midpoint-odd-spans",
    ),
    pytest.param(
        msg((4, 4, WILDCARD), (7, 7, WILDCARD)),
        msg((0, 29, WILDCARD), (1, 30, WILDCARD)),
        (4, 7),
        id="midpoint-single-value",
    ),
    # a wildcard defers to the other peer's value, which is then clamped to the range
    pytest.param(
        msg((0, 29, WILDCARD), (1, 30, WILDCARD)), msg((0, 29, 9), (1, 30, 11)), (9, 11), id="one-wildcard"
    ),
    pytest.param(
        msg((0, 5, WILDCARD), (1, 8, WILDCARD)),
        msg((0, 20, 12), (1, 20, 14)),
        (5, 8),
        id="wildcard-clamped-down",
    ),
    pytest.param(
        msg((7, 9, WILDCARD), (9, 12, WILDCARD)),
        msg((0, 20, 2), (1, 20, 3)),
        (7, 9),
        id="wildcard-clamped-up",
    ),
    # the smaller recommendation is clamped up to the other peer's minimum
    pytest.param(msg((2, 10, 2), (3, 12, 3)), msg((6, 10, 8), (8, 12, 9)), (6, 8), id="rec-clamped-up"),
    # quick init: the requester's values win even over smaller ones from the server
    pytest.param(
        msg((0, 29, 12), (1, 30, 18), qr=True),
        msg((0, 29, 3), (1, 30, 4), qa=True),
        (12, 18),
        id="quick-wins",
    ),
    # quick init values are capped like any others
    pytest.param(
        msg((0, 29, 20), (1, 30, 20), qr=True),
        msg((0, 29, 1), (1, 30, 1), qa=True),
        (15, 15),
        id="quick-capped",
    ),
    # the server may use wildcards
    pytest.param(
        msg((0, 29, 5), (1, 30, 6), qr=True),
        msg((0, 29, WILDCARD), (1, 30, WILDCARD), qa=True),
        (5, 6),
        id="quick-server-wildcards",
    ),
    # a version both sides agree on other than 1
    pytest.param(msg(version=9), msg(version=9), (14, 16), id="same-version-9"),
]


@pytest.mark.parametrize(("a", "b", "expected"), RULES)
def test_negotiation_rules(a: InitMessage, b: InitMessage, expected: tuple[int, int]) -> None:
    assert both_orders(a, b) == Negotiated(*expected)


RULE_FAILURES = [
    pytest.param(
        msg((0, 29, 5), (1, 8, 5)),
        msg((0, 29, 5), (9, 30, 10)),
        ["length bits", "max 8 < min 9"],
        id="length",
    ),
    pytest.param(msg((0, 3, 2)), msg((4, 29, 4)), ["id bits", "max 3 < min 4"], id="id"),
    pytest.param(msg(version=1), msg(version=2), ["version", "1", "2"], id="version-mismatch"),
    pytest.param(msg(version=255), msg(version=1), ["version", "255"], id="version-mismatch-255"),
    pytest.param(
        msg((0, 29, 3), (1, 30, 4), qr=True),
        msg((4, 29, 4), (1, 30, 4), qa=True),
        ["quick init id bits 3", "4..29"],
        id="quick-id-below-server-min",
    ),
]


@pytest.mark.parametrize(("a", "b", "needles"), RULE_FAILURES)
def test_negotiation_rule_failures(a: InitMessage, b: InitMessage, needles: list[str]) -> None:
    both_orders_fail(a, b, needles)


# -- quick init truth table ----------------------------------------------------------------

# Messages compatible in every respect, whose three possible outcomes all differ:
# normal (min of the recommendations) (8, 10), quick with A's values (12, 10), with B's (8, 16).
QA_BASE = msg((4, 20, 12), (4, 20, 10))
QB_BASE = msg((2, 22, 8), (2, 22, 16))
NORMAL, QUICK_A, QUICK_B = Negotiated(8, 10), Negotiated(12, 10), Negotiated(8, 16)

# (A QR, B QR, A QA, B QA, result); None is "don't care", a result None is a failure.
TRUTH_TABLE = [
    pytest.param(0, 0, None, None, NORMAL, id="normal"),
    pytest.param(1, 0, 0, 1, QUICK_A, id="quick-a"),
    pytest.param(0, 1, 1, 0, QUICK_B, id="quick-b"),
    pytest.param(1, None, None, 0, None, id="a-requests-b-disallows"),
    pytest.param(None, 1, 0, None, None, id="b-requests-a-disallows"),
    pytest.param(1, 1, None, None, None, id="both-request"),
    pytest.param(1, None, 1, None, None, id="a-invalid"),
    pytest.param(None, 1, None, 1, None, id="b-invalid"),
]


@pytest.mark.parametrize(("a_qr", "b_qr", "a_qa", "b_qa", "expected"), TRUTH_TABLE)
def test_quick_init_truth_table(
    a_qr: int | None, b_qr: int | None, a_qa: int | None, b_qa: int | None, expected: Negotiated | None
) -> None:
    def options(bit: int | None) -> list[bool]:
        return [False, True] if bit is None else [bool(bit)]

    combos = list(product(options(a_qr), options(b_qr), options(a_qa), options(b_qa)))
    assert len(combos) in (1, 4)
    for aqr, bqr, aqa, bqa in combos:
        a = replace(QA_BASE, quick_request=aqr, quick_allowed=aqa)
        b = replace(QB_BASE, quick_request=bqr, quick_allowed=bqa)
        if expected is None:
            both_orders_fail(a, b, ["quick init"])
        else:
            assert both_orders(a, b) == expected, (aqr, bqr, aqa, bqa)


def test_quick_init_failure_reasons() -> None:
    a = replace(QA_BASE, quick_request=True)
    both_orders_fail(a, QB_BASE, ["quick init requested", "does not allow"])
    both_orders_fail(a, replace(QB_BASE, quick_request=True), ["both peers requested quick init"])
    both_orders_fail(
        replace(a, quick_allowed=True), QB_BASE, ["both quick init request and quick init allowed"]
    )


# -- invalid messages ----------------------------------------------------------------------

INVALID = [
    pytest.param(
        msg(qr=True, qa=True), ["both quick init request and quick init allowed"], id="both-quick-bits"
    ),
    pytest.param(msg((0, 29, WILDCARD), qr=True), ["quick init", "wildcard", "id"], id="quick-id-wildcard"),
    pytest.param(
        msg(lengths=(1, 30, WILDCARD), qr=True), ["quick init", "wildcard", "length"], id="quick-len-wildcard"
    ),
    pytest.param(msg((8, 6, 7)), ["id max bits 6 < min bits 8"], id="id-max-below-min"),
    pytest.param(msg(lengths=(10, 9, 9)), ["length max bits 9 < min bits 10"], id="length-max-below-min"),
    pytest.param(msg((4, 10, 3)), ["id recommended bits 3", "4..10"], id="id-rec-below-min"),
    pytest.param(msg((4, 10, 11)), ["id recommended bits 11", "4..10"], id="id-rec-above-max"),
    pytest.param(msg(lengths=(4, 10, 3)), ["length recommended bits 3", "4..10"], id="length-rec-below-min"),
    pytest.param(
        msg(lengths=(4, 10, 30)), ["length recommended bits 30", "4..10"], id="length-rec-above-max"
    ),
    pytest.param(msg((0, 29, 30)), ["id recommended bits 30"], id="id-rec-30"),
    pytest.param(msg((0, 30, 14)), ["id max bits 30"], id="id-max-30"),
    pytest.param(msg((0, 31, 14)), ["id max bits 31"], id="id-max-31"),
    pytest.param(msg(lengths=(0, 30, 16)), ["length min bits 0"], id="length-min-0"),
    pytest.param(msg(lengths=(1, 31, 16)), ["length max bits 31"], id="length-max-31"),
    pytest.param(msg(lengths=(0, 0, 0)), ["length min bits 0"], id="length-all-0"),
    pytest.param(msg(version=0), ["version 0"], id="version-0"),
]


@pytest.mark.parametrize(("bad", "needles"), INVALID)
def test_invalid_messages_fail_negotiation(bad: InitMessage, needles: list[str]) -> None:
    with pytest.raises(NegotiationError) as info:
        bad.check()
    for needle in needles:
        assert needle in info.value.detail, (needle, info.value.detail)
    # against a partner that would accept anything valid, in both orders
    for good in (msg((0, 29, WILDCARD), (1, 30, WILDCARD)), msg(qa=True)):
        both_orders_fail(bad, good, needles)


def test_valid_edge_messages_pass_check() -> None:
    for m in (
        InitMessage(),
        msg((0, 0, 0), (1, 1, 1)),
        msg((15, 29, 29), (15, 30, 30), qr=True, version=255),
        msg((0, 29, WILDCARD), (1, 30, WILDCARD), qa=True),
        msg((15, 15, 15), (15, 15, 15)),
    ):
        m.check()


def test_defaults() -> None:
    m = InitMessage()
    assert (m.version, m.quick_request, m.quick_allowed) == (PROTOCOL_VERSION, False, False)
    assert PROTOCOL_VERSION == 1
    assert WILDCARD == 31
    assert both_orders(m, m) == Negotiated(14, 16)


# -- negotiation against a model of the spec -------------------------------------------------


def _valid(m: InitMessage) -> bool:
    if not 1 <= m.version <= 255 or (m.quick_request and m.quick_allowed):
        return False
    for lo, hi, rec, lo_min, hi_max in (
        (m.id_min, m.id_max, m.id_rec, 0, 29),
        (m.length_min, m.length_max, m.length_rec, 1, 30),
    ):
        if not (lo_min <= lo <= 15 and lo_min <= hi <= hi_max and lo <= hi):
            return False
        if rec == WILDCARD:
            if m.quick_request:
                return False
        elif not lo <= rec <= hi:
            return False
    return True


def model_negotiate(a: InitMessage, b: InitMessage) -> tuple[int, int] | None:
    """The spec's algorithm, written from its text; None is a failed negotiation."""
    if not (_valid(a) and _valid(b)) or a.version != b.version:
        return None
    if (a.quick_request and not b.quick_allowed) or (b.quick_request and not a.quick_allowed):
        return None
    quick = a if a.quick_request else b if b.quick_request else None
    values = []
    for field in ("id", "length"):
        ta = (getattr(a, f"{field}_min"), getattr(a, f"{field}_max"), getattr(a, f"{field}_rec"))
        tb = (getattr(b, f"{field}_min"), getattr(b, f"{field}_max"), getattr(b, f"{field}_rec"))
        lo, hi = max(ta[0], tb[0]), min(ta[1], tb[1])
        if hi < lo:
            return None
        if quick is not None:
            rec = getattr(quick, f"{field}_rec")
            if not lo <= rec <= hi:
                return None
        elif ta[2] == WILDCARD and tb[2] == WILDCARD:
            rec = math.ceil((hi - lo) / 2) + lo
        elif ta[2] == WILDCARD:
            rec = tb[2]
        elif tb[2] == WILDCARD:
            rec = ta[2]
        else:
            rec = min(ta[2], tb[2])
        values.append(min(max(rec, lo), hi))
    id_bits, length_bits = values
    if id_bits + length_bits > 30:
        if id_bits > 15 and length_bits > 15:
            id_bits = length_bits = 15
        elif id_bits > length_bits:
            id_bits = 30 - length_bits
        else:
            length_bits = 30 - id_bits
    return id_bits, length_bits


@st.composite
def valid_inits(draw: st.DrawFn, version: int | None = None) -> InitMessage:
    quick = draw(st.sampled_from(["none", "request", "allow"]))
    fields = []
    for lo_min, hi_max in ((0, 29), (1, 30)):
        lo = draw(st.integers(lo_min, 15))
        hi = draw(st.integers(lo, hi_max))
        rec = draw(st.integers(lo, hi) if quick == "request" else st.integers(lo, hi) | st.just(WILDCARD))
        fields += [lo, hi, rec]
    v = draw(st.integers(1, 255)) if version is None else version
    return InitMessage(v, quick == "request", quick == "allow", *fields)


# Anything the 40 bits can carry (a decoded message), mostly invalid.
raw_inits = st.builds(
    InitMessage,
    st.integers(0, 2),
    st.booleans(),
    st.booleans(),
    st.integers(0, 15),
    st.integers(0, 31),
    st.integers(0, 31),
    st.integers(0, 15),
    st.integers(0, 31),
    st.integers(0, 31),
)
any_inits = valid_inits(version=1) | raw_inits


@settings(max_examples=400, deadline=None)
@given(a=any_inits, b=any_inits)
def test_negotiation_matches_spec_model(a: InitMessage, b: InitMessage) -> None:
    expected = model_negotiate(a, b)
    if expected is None:
        both_orders_fail(a, b, [])
    else:
        got = both_orders(a, b)
        assert got == Negotiated(*expected)
        assert 0 <= got.id_bits <= 29 and 1 <= got.length_bits <= 30
        assert got.id_bits + got.length_bits <= 30


@settings(max_examples=300, deadline=None)
@given(a=valid_inits(version=1), b=valid_inits(version=1))
def test_negotiation_of_valid_messages(a: InitMessage, b: InitMessage) -> None:
    expected = model_negotiate(a, b)
    try:
        got = negotiate(a, b)
    except NegotiationError:
        assert expected is None
        with pytest.raises(NegotiationError):
            negotiate(b, a)
    else:
        assert expected is not None
        assert got == negotiate(b, a) == Negotiated(*expected)


# -- initialize message bytes --------------------------------------------------------------

# Worked out bit by bit (byte 0 version; then 2 reserved, QR, QA, id min:4, id max:5,
# id rec:5, length min:4, length max:5, length rec:5, most significant first):
INIT_VECTORS = [
    # 00 0 0 0001 | 11101 01110 0110 11110 10000 -> 0000_0001 1110_1011 1001_1011 1101_0000
    pytest.param(InitMessage(), "01 01 eb 9b d0", id="defaults"),
    # 00 0 0 0110 | 01100 01000 0110 10100 01110 -> 0000_0110 0110_0010 0001_1010 1000_1110
    pytest.param(msg((6, 12, 8), (6, 20, 14)), "01 06 62 1a 8e", id="spec-example-a"),
    # 00 1 0 1000 | 01111 01000 1010 10010 01110 -> 0010_1000 0111_1010 0010_1010 0100_1110
    pytest.param(msg((8, 15, 8), (10, 18, 14), qr=True), "01 28 7a 2a 4e", id="quick-request"),
    # 00 0 1 0000 | 00000 11111 1111 11110 11111 -> 0001_0000 0000_0111 1111_1111 1101_1111
    pytest.param(
        msg((0, 0, WILDCARD), (15, 30, WILDCARD), qa=True, version=7),
        "07 10 07 ff df",
        id="quick-allowed-wildcards",
    ),
    # 00 1 0 1111 | 11101 11101 1111 11110 11110 -> 0010_1111 1110_1111 0111_1111 1101_1110
    pytest.param(msg((15, 29, 29), (15, 30, 30), qr=True, version=255), "ff 2f ef 7f de", id="all-max"),
    # 00 0 0 0000 | 00000 00000 0001 00001 00001 -> 0000_0000 0000_0000 0000_0100 0010_0001
    pytest.param(msg((0, 0, 0), (1, 1, 1)), "01 00 00 04 21", id="all-min"),
    # single fields, one at a time, over an all-zero word
    pytest.param(InitMessage(1, True, False, 0, 0, 0, 0, 0, 0), "01 20 00 00 00", id="qr-bit"),
    pytest.param(InitMessage(1, False, True, 0, 0, 0, 0, 0, 0), "01 10 00 00 00", id="qa-bit"),
    pytest.param(InitMessage(1, False, False, 15, 0, 0, 0, 0, 0), "01 0f 00 00 00", id="id-min-bits"),
    pytest.param(InitMessage(1, False, False, 0, 31, 0, 0, 0, 0), "01 00 f8 00 00", id="id-max-bits"),
    pytest.param(InitMessage(1, False, False, 0, 0, 31, 0, 0, 0), "01 00 07 c0 00", id="id-rec-bits"),
    pytest.param(InitMessage(1, False, False, 0, 0, 0, 15, 0, 0), "01 00 00 3c 00", id="length-min-bits"),
    pytest.param(InitMessage(1, False, False, 0, 0, 0, 0, 31, 0), "01 00 00 03 e0", id="length-max-bits"),
    pytest.param(InitMessage(1, False, False, 0, 0, 0, 0, 0, 31), "01 00 00 00 1f", id="length-rec-bits"),
]


@pytest.mark.parametrize(("m", "expected"), INIT_VECTORS)
def test_encode_init_vectors(m: InitMessage, expected: str) -> None:
    assert encode_init(m) == h(expected)


@pytest.mark.parametrize(
    ("m", "needle"),
    [
        (InitMessage(256, False, False, 0, 0, 0, 0, 0, 0), "version=256 does not fit 8 bits"),
        (InitMessage(1, False, False, 16, 0, 0, 0, 0, 0), "id_min=16 does not fit 4 bits"),
        (InitMessage(1, False, False, 0, 32, 0, 0, 0, 0), "id_max=32 does not fit 5 bits"),
        (InitMessage(1, False, False, 0, 0, -1, 0, 0, 0), "id_rec=-1 does not fit 5 bits"),
        (InitMessage(1, False, False, 0, 0, 0, 16, 0, 0), "length_min=16 does not fit 4 bits"),
        (InitMessage(1, False, False, 0, 0, 0, 0, 32, 0), "length_max=32 does not fit 5 bits"),
        (InitMessage(1, False, False, 0, 0, 0, 0, 0, 99), "length_rec=99 does not fit 5 bits"),
    ],
)
def test_encode_init_refuses_fields_wider_than_their_bits(m: InitMessage, needle: str) -> None:
    with pytest.raises(ValueError, match=f"streamux initialize field {needle}"):
        encode_init(m)


@pytest.mark.parametrize(("m", "expected"), INIT_VECTORS)
def test_decode_init_vectors(m: InitMessage, expected: str) -> None:
    raw = h(expected)
    assert decode_init(raw) == m
    assert decode_init(bytearray(raw)) == m
    assert decode_init(memoryview(raw)) == m


@pytest.mark.parametrize(("m", "expected"), INIT_VECTORS)
@pytest.mark.parametrize("reserved", [0x40, 0x80, 0xC0])
def test_decode_init_reserved_bits(m: InitMessage, expected: str, reserved: int) -> None:
    raw = bytearray(h(expected))
    raw[1] |= reserved
    with pytest.raises(ProtocolError, match="reserved") as info:
        decode_init(bytes(raw))
    assert info.value.format == "streamux"


@pytest.mark.parametrize("size", [0, 1, 4, 6, 10])
def test_decode_init_wrong_length(size: int) -> None:
    with pytest.raises(ProtocolError) as info:
        decode_init(h("01 01 eb 9b d0 00 00 00 00 00")[:size])
    assert info.value.format == "streamux"
    assert f"{size} bytes" in info.value.detail
    assert "5" in info.value.detail


@settings(max_examples=300, deadline=None)
@given(m=valid_inits())
def test_init_roundtrip(m: InitMessage) -> None:
    m.check()
    raw = encode_init(m)
    assert len(raw) == 5
    assert raw[0] == m.version
    assert not raw[1] & 0xC0
    assert decode_init(raw) == m


@settings(max_examples=300, deadline=None)
@given(raw=st.binary(min_size=5, max_size=5).filter(lambda b: not b[1] & 0xC0))
def test_init_bytes_roundtrip(raw: bytes) -> None:
    # every 40-bit message without reserved bits decodes, and encodes back to itself
    assert encode_init(decode_init(raw)) == raw


# -- chunk header sizes --------------------------------------------------------------------

SIZES = [
    ((0, 1), 1),
    ((1, 1), 1),
    ((0, 6), 1),
    ((2, 4), 1),
    ((2, 5), 2),
    ((1, 6), 2),
    ((5, 9), 2),
    ((6, 8), 2),
    ((7, 7), 2),
    ((6, 9), 3),
    ((7, 8), 3),
    ((10, 12), 3),
    ((11, 11), 3),
    ((10, 13), 4),
    ((11, 12), 4),
    ((10, 14), 4),
    ((15, 15), 4),
    ((0, 30), 4),
    ((29, 1), 4),
]


@pytest.mark.parametrize(("widths", "size"), SIZES)
def test_negotiated_properties(widths: tuple[int, int], size: int) -> None:
    n = Negotiated(*widths)
    assert n.header_size == size
    assert n.max_length == 2 ** widths[1] - 1
    assert n.id_count == 2 ** widths[0]
    assert len(encode_header(n, 0, 0, False, False)) == size
    assert len(encode_header(n, n.id_count - 1, n.max_length, True, True)) == size


def test_negotiated_property_values() -> None:
    assert (Negotiated(0, 1).max_length, Negotiated(0, 1).id_count) == (1, 1)
    assert (Negotiated(15, 15).max_length, Negotiated(15, 15).id_count) == (32767, 32768)
    assert (Negotiated(0, 30).max_length, Negotiated(29, 1).id_count) == (2**30 - 1, 2**29)
    assert Negotiated(14, 16) == (14, 16)


# -- chunk header bytes --------------------------------------------------------------------

# (id bits, length bits, id, length, response, termination, hex), worked out by hand:
# value = ((id << length_bits | length) << 2 | response << 1 | termination), little endian.
HEADERS: list[tuple[int, int, int, int, bool, bool, str]] = [
    # 0/1: 1 byte, 3 bits used: 00000lrt
    (0, 1, 0, 1, True, True, "07"),
    (0, 1, 0, 0, False, True, "01"),
    (0, 1, 0, 1, False, False, "04"),
    (0, 1, 0, 0, True, False, "02"),
    # 2/4: 1 byte, all bits used: iillllrt
    (2, 4, 3, 15, True, True, "ff"),
    (2, 4, 3, 0, False, False, "c0"),
    (2, 4, 0, 15, False, True, "3d"),
    (2, 4, 1, 2, True, False, "4a"),  # 01 0010 1 0
    # 0/6: the spec's llllllrt
    (0, 6, 0, 63, True, True, "ff"),
    (0, 6, 0, 63, False, False, "fc"),
    (0, 6, 0, 1, False, True, "05"),
    # 2/5: 2 bytes, 9 bits used
    (2, 5, 3, 31, True, True, "ff 01"),
    (2, 5, 2, 1, False, True, "05 01"),  # (2 << 5 | 1) << 2 | 1 = 261 = 0x105
    (2, 5, 0, 31, False, False, "7c 00"),
    # 5/9: the spec's iiiiilllllllllrt
    (5, 9, 31, 511, True, True, "ff ff"),
    (5, 9, 17, 300, False, True, "b1 8c"),  # (17 << 9 | 300) << 2 | 1 = 36017 = 0x8cb1
    # 6/8: 2 bytes, all bits used
    (6, 8, 63, 255, True, True, "ff ff"),
    (6, 8, 63, 0, False, False, "00 fc"),
    (6, 8, 0, 255, False, True, "fd 03"),
    (6, 8, 1, 1, True, False, "06 04"),  # (256 + 1) << 2 | 2 = 1030 = 0x406
    # 6/9: 3 bytes, 17 bits used
    (6, 9, 63, 511, True, True, "ff ff 01"),
    (6, 9, 63, 0, False, False, "00 f8 01"),  # 63 << 11 = 0x1f800
    (6, 9, 0, 511, False, True, "fd 07 00"),
    # 10/12: 3 bytes, all bits used
    (10, 12, 1023, 4095, True, True, "ff ff ff"),
    (10, 12, 1023, 0, False, False, "00 c0 ff"),  # 1023 << 14 = 0xffc000
    (10, 12, 0, 4095, False, False, "fc 3f 00"),
    (10, 12, 5, 10, False, True, "29 40 01"),  # (5 << 12 | 10) << 2 | 1 = 81961 = 0x14029
    # 10/13: 4 bytes, 25 bits used
    (10, 13, 1023, 8191, True, True, "ff ff ff 01"),
    (10, 13, 1023, 0, True, False, "02 80 ff 01"),  # 1023 << 15 | 2 = 0x1ff8002
    (10, 13, 0, 8191, False, True, "fd 7f 00 00"),
    # 10/14: the spec's 000000iiiiiiiiiillllllllllllllrt
    (10, 14, 1023, 16383, True, True, "ff ff ff 03"),
    (10, 14, 1, 0, False, False, "00 00 01 00"),
    # 15/15: 4 bytes, all bits used
    (15, 15, 32767, 32767, True, True, "ff ff ff ff"),
    (15, 15, 32767, 0, False, False, "00 00 fe ff"),  # 0x7fff << 17 = 0xfffe0000
    (15, 15, 0, 32767, False, True, "fd ff 01 00"),
    (15, 15, 1, 1, True, True, "07 00 02 00"),  # (1 << 15 | 1) << 2 | 3 = 0x20007
    # 0/30
    (0, 30, 0, 2**30 - 1, True, True, "ff ff ff ff"),
    (0, 30, 0, 0, False, True, "01 00 00 00"),
    (0, 30, 0, 1, False, False, "04 00 00 00"),
    (0, 30, 0, 0x123456, True, False, "5a d1 48 00"),  # 0x123456 << 2 | 2 = 0x48d15a
    # 29/1
    (29, 1, 2**29 - 1, 1, True, True, "ff ff ff ff"),
    (29, 1, 2**29 - 1, 0, False, False, "f8 ff ff ff"),
    (29, 1, 0, 1, False, True, "05 00 00 00"),
    (29, 1, 1, 0, True, False, "0a 00 00 00"),
]
HEADER_CASES = [
    pytest.param(*row, id=f"{row[0]}-{row[1]}-id{row[2]}-len{row[3]}-r{int(row[4])}t{int(row[5])}")
    for row in HEADERS
]
BIG = 2**21  # longer payloads are not built; their headers are checked as pending


def test_header_table_covers_every_width() -> None:
    assert {n.header_size for n in (Negotiated(r[0], r[1]) for r in HEADERS)} == {1, 2, 3, 4}
    widths = {(r[0], r[1]) for r in HEADERS}
    assert widths >= {(0, 1), (2, 4), (2, 5), (6, 8), (6, 9), (10, 12), (10, 13), (15, 15), (0, 30), (29, 1)}


@pytest.mark.parametrize(("ib", "lb", "rid", "length", "resp", "term", "expected"), HEADER_CASES)
def test_encode_header_vectors(
    ib: int, lb: int, rid: int, length: int, resp: bool, term: bool, expected: str
) -> None:
    assert encode_header(Negotiated(ib, lb), rid, length, resp, term) == h(expected)


@pytest.mark.parametrize(("ib", "lb", "rid", "length", "resp", "term", "expected"), HEADER_CASES)
def test_decode_header_vectors(
    ib: int, lb: int, rid: int, length: int, resp: bool, term: bool, expected: str
) -> None:
    n = Negotiated(ib, lb)
    raw = h(expected)
    dec = Decoder(n)
    if length > BIG:
        assert dec.feed(raw + b"abc") == []
        assert dec.pending == len(raw) + 3
        return
    payload = body(length)
    assert norm(dec.feed(raw + payload)) == [Chunk(rid, resp, term, payload)]
    assert dec.pending == 0
    # the header alone waits for its payload (if it has one)
    dec = Decoder(n)
    got = dec.feed(raw)
    if length:
        assert got == []
        assert dec.pending == len(raw)
        assert norm(dec.feed(payload)) == [Chunk(rid, resp, term, payload)]
    else:
        assert norm(got) == [Chunk(rid, resp, term, b"")]
    assert dec.pending == 0


@pytest.mark.parametrize(("widths", "size"), SIZES)
def test_encode_header_rejects_values_that_do_not_fit(widths: tuple[int, int], size: int) -> None:
    n = Negotiated(*widths)
    encode_header(n, n.id_count - 1, n.max_length, True, True)
    with pytest.raises(ValueError, match="request id"):
        encode_header(n, n.id_count, 0, False, False)
    with pytest.raises(ValueError, match="request id"):
        encode_header(n, -1, 0, False, False)
    with pytest.raises(ValueError, match="chunk length"):
        encode_header(n, 0, n.max_length + 1, False, False)
    with pytest.raises(ValueError, match="chunk length"):
        encode_header(n, 0, -1, False, False)


def test_encode_header_rejection_messages() -> None:
    with pytest.raises(ValueError, match=r"request id 1 .*0 bits"):
        encode_header(Negotiated(0, 6), 1, 0, False, True)
    with pytest.raises(ValueError, match=r"chunk length 2 .*1 bits"):
        encode_header(Negotiated(29, 1), 0, 2, False, True)
    with pytest.raises(ValueError, match=r"request id 1024 .*10 bits"):
        encode_header(Negotiated(10, 12), 1024, 0, False, True)


# -- out-of-band encodings -----------------------------------------------------------------

# 6/8, id 5: (5 << 8 | 0) << 2 = 0x1400 -> "00 14" plus the response/termination bits.
OOB = [
    pytest.param("00 14", False, False, id="cancel"),
    pytest.param("02 14", True, False, id="cancel-ack"),
    pytest.param("01 14", False, True, id="ping"),
    pytest.param("03 14", True, True, id="ping-ack"),
]


@pytest.mark.parametrize(("raw", "resp", "term"), OOB)
def test_oob_encodings(raw: str, resp: bool, term: bool) -> None:
    n = Negotiated(6, 8)
    assert encode_header(n, 5, 0, resp, term) == h(raw)
    (chunk,) = Decoder(n).feed(h(raw))
    assert (chunk.id, chunk.response, chunk.termination, bytes(chunk.payload)) == (5, resp, term, b"")


@pytest.mark.parametrize(("widths", "size"), SIZES)
def test_oob_encodings_at_every_width(widths: tuple[int, int], size: int) -> None:
    n = Negotiated(*widths)
    rid = n.id_count - 1
    oob = [Chunk(rid, resp, term, b"") for resp in (False, True) for term in (False, True)]
    raw = b"".join(encode_header(n, c.id, 0, c.response, c.termination) for c in oob)
    # id in the top bits, zero length, then exactly the two flag bits
    assert [int.from_bytes(raw[i : i + size], "little") for i in range(0, len(raw), size)] == [
        rid << (widths[1] + 2) | flags for flags in range(4)
    ]
    dec = Decoder(n)
    assert norm(dec.feed(raw)) == oob
    assert dec.pending == 0


# -- unused high bits ----------------------------------------------------------------------

# (id bits, length bits, hex, the header value as the message must name it)
UNUSED = [
    pytest.param(0, 1, "08", "0x08", id="0-1-bit3"),
    pytest.param(0, 1, "ff", "0xff", id="0-1-all"),
    pytest.param(0, 2, "10", "0x10", id="0-2-bit4"),
    pytest.param(2, 5, "00 02", "0x0200", id="2-5-bit9"),
    pytest.param(2, 5, "ff ff", "0xffff", id="2-5-all"),
    pytest.param(5, 5, "00 10", "0x1000", id="5-5-bit12"),
    pytest.param(1, 6, "00 80", "0x8000", id="1-6-bit15"),
    pytest.param(6, 9, "00 00 02", "0x020000", id="6-9-bit17"),
    pytest.param(6, 9, "ff ff ff", "0xffffff", id="6-9-all"),
    pytest.param(7, 8, "00 00 80", "0x800000", id="7-8-bit23"),
    pytest.param(10, 13, "00 00 00 02", "0x02000000", id="10-13-bit25"),
    pytest.param(10, 13, "00 00 00 80", "0x80000000", id="10-13-bit31"),
    pytest.param(10, 14, "00 00 00 04", "0x04000000", id="10-14-bit26"),
    pytest.param(0, 23, "01 00 00 02", "0x02000001", id="0-23-bit25"),
]


@pytest.mark.parametrize(("ib", "lb", "raw", "value"), UNUSED)
def test_unused_high_bits_are_a_protocol_error(ib: int, lb: int, raw: str, value: str) -> None:
    n = Negotiated(ib, lb)
    with pytest.raises(ProtocolError) as info:
        Decoder(n).feed(h(raw))
    assert info.value.format == "streamux"
    assert value in info.value.detail, info.value.detail
    assert "unused" in info.value.detail
    # also after a good chunk, and fed byte by byte
    good = encode_header(n, 0, 1, False, True) + b"x"
    with pytest.raises(ProtocolError, match=value):
        Decoder(n).feed(good + h(raw))
    dec = Decoder(n)
    assert norm(dec.feed(good)) == [Chunk(0, False, True, b"x")]
    with pytest.raises(ProtocolError, match=value):
        for byte in h(raw):
            dec.feed(bytes([byte]))


@pytest.mark.parametrize(("widths", "size"), SIZES)
def test_largest_header_without_unused_bits_decodes(widths: tuple[int, int], size: int) -> None:
    n = Negotiated(*widths)
    used = widths[0] + widths[1] + 2
    top = (1 << used) - 1
    raw = (top & ~(n.max_length << 2)).to_bytes(size, "little")  # every bit but the length
    assert norm(Decoder(n).feed(raw)) == [Chunk(n.id_count - 1, True, True, b"")]
    if used < 8 * size:
        with pytest.raises(ProtocolError):
            Decoder(n).feed((1 << used).to_bytes(size, "little"))


# -- incremental decoding ------------------------------------------------------------------


def _stream(n: Negotiated, seed: int) -> tuple[bytes, list[Chunk]]:
    rng = random.Random(seed)
    chunks = []
    for i in range(25):
        length = rng.choice([0, 1, n.max_length, rng.randint(0, min(n.max_length, 700))])
        length = min(length, 3000)
        rid = rng.choice([0, n.id_count - 1, rng.randrange(n.id_count)])
        chunks.append(Chunk(rid, bool(i & 1), bool(i & 2), rng.randbytes(length)))
    data = b"".join(
        encode_header(n, c.id, len(c.payload), c.response, c.termination) + c.payload for c in chunks
    )
    return data, chunks


STREAM_WIDTHS = [(0, 1), (2, 4), (2, 5), (6, 8), (6, 9), (10, 12), (10, 13), (15, 15), (0, 30), (29, 1)]
STREAMS = {w: _stream(Negotiated(*w), i) for i, w in enumerate(STREAM_WIDTHS)}


def _feed(n: Negotiated, pieces: list[bytes] | list[bytes | bytearray | memoryview]) -> list[Chunk]:
    dec = Decoder(n)
    out: list[Chunk] = []
    for piece in pieces:
        out += dec.feed(piece)
        assert dec.pending <= n.header_size + n.max_length
    assert dec.pending == 0
    return norm(out)


@pytest.mark.parametrize("widths", STREAM_WIDTHS)
def test_feed_whole_stream(widths: tuple[int, int]) -> None:
    data, expected = STREAMS[widths]
    assert _feed(Negotiated(*widths), [data]) == expected


@pytest.mark.parametrize("widths", STREAM_WIDTHS)
def test_feed_byte_by_byte(widths: tuple[int, int]) -> None:
    data, expected = STREAMS[widths]
    assert _feed(Negotiated(*widths), [data[i : i + 1] for i in range(len(data))]) == expected


@pytest.mark.parametrize("widths", STREAM_WIDTHS)
def test_feed_bytearray_and_memoryview_with_empty_pieces(widths: tuple[int, int]) -> None:
    data, expected = STREAMS[widths]
    pieces: list[bytes | bytearray | memoryview] = [
        b"",
        bytearray(data[:3]),
        b"",
        memoryview(data[3:500]),
        b"",
        data[500:],
        b"",
    ]
    assert _feed(Negotiated(*widths), pieces) == expected


@pytest.mark.parametrize("widths", STREAM_WIDTHS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_feed_random_splits(widths: tuple[int, int], data: st.DataObject) -> None:
    stream, expected = STREAMS[widths]
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=40).map(sorted), label="cuts")
    assert _feed(Negotiated(*widths), [stream[a:b] for a, b in pairwise([0, *cuts, len(stream)])]) == expected


def test_streamed_body_survives_an_empty_read() -> None:
    n = Negotiated(6, 9)
    dec = Decoder(n, stream_bodies=True)
    header = encode_header(n, 3, 5, False, True)
    assert norm(dec.feed(header + b"ab")) == [Chunk(3, False, False, b"ab")]
    assert dec.feed(b"") == []  # nothing of the body: no empty piece (it would read as a cancel)
    assert dec.pending == len(header) + 2
    assert norm(dec.feed(b"cde")) == [Chunk(3, False, True, b"cde")]


def test_pending_counts_the_incomplete_chunk() -> None:
    n = Negotiated(6, 9)
    dec = Decoder(n)
    header = encode_header(n, 3, 5, False, True)
    assert dec.feed(header[:2]) == []
    assert dec.pending == 2
    assert dec.feed(header[2:] + b"abc") == []
    assert dec.pending == 6
    nxt = encode_header(n, 4, 1, True, True)
    assert norm(dec.feed(b"de" + nxt)) == [Chunk(3, False, True, b"abcde")]
    assert dec.pending == 3
    assert norm(dec.feed(b"z")) == [Chunk(4, True, True, b"z")]
    assert dec.pending == 0


def test_payloads_are_views_and_mutable_input_is_not_aliased() -> None:
    n = Negotiated(2, 5)
    raw = encode_header(n, 1, 5, False, True) + b"hello"
    (chunk,) = Decoder(n).feed(raw)
    assert isinstance(chunk.payload, memoryview)
    assert bytes(chunk.payload) == b"hello"
    buf = bytearray(raw)
    (chunk,) = Decoder(n).feed(buf)
    buf[-5:] = b"XXXXX"
    assert bytes(chunk.payload) == b"hello"


# -- hypothesis: round trips and arbitrary input -------------------------------------------


@st.composite
def widths_and_chunks(draw: st.DrawFn) -> tuple[Negotiated, list[Chunk]]:
    length_bits = draw(st.integers(1, 30))
    id_bits = draw(st.integers(0, 30 - length_bits))
    n = Negotiated(id_bits, length_bits)
    chunk = st.builds(
        Chunk,
        st.integers(0, n.id_count - 1),
        st.booleans(),
        st.booleans(),
        st.binary(max_size=min(n.max_length, 300)),
    )
    return n, draw(st.lists(chunk, max_size=12))


@settings(max_examples=300, deadline=None)
@given(case=widths_and_chunks(), data=st.data())
def test_chunk_roundtrip(case: tuple[Negotiated, list[Chunk]], data: st.DataObject) -> None:
    n, chunks = case
    headers = [encode_header(n, c.id, len(c.payload), c.response, c.termination) for c in chunks]
    assert all(len(hdr) == n.header_size for hdr in headers)
    stream = b"".join(hdr + c.payload for hdr, c in zip(headers, chunks, strict=True))
    assert _feed(n, [stream]) == chunks
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20).map(sorted), label="cuts")
    assert _feed(n, [stream[a:b] for a, b in pairwise([0, *cuts, len(stream)])]) == chunks


@settings(max_examples=300, deadline=None)
@given(
    length_bits=st.integers(1, 30),
    id_frac=st.floats(0, 1),
    raw=st.binary(max_size=400),
    cuts=st.lists(st.integers(0, 400), max_size=10),
)
def test_arbitrary_bytes_raise_only_protocol_error(
    length_bits: int, id_frac: float, raw: bytes, cuts: list[int]
) -> None:
    n = Negotiated(int(id_frac * (30 - length_bits)), length_bits)
    dec = Decoder(n)
    bounds = [0, *sorted(min(c, len(raw)) for c in cuts), len(raw)]
    try:
        for a, b in pairwise(bounds):
            for chunk in dec.feed(raw[a:b]):
                assert 0 <= chunk.id < n.id_count
                assert len(chunk.payload) <= n.max_length
            assert dec.pending <= n.header_size + n.max_length
    except ProtocolError as err:
        assert err.format == "streamux"
        assert "unused" in err.detail


# -- streamed chunk bodies (what the engine uses) ------------------------------------------


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    chunks=st.lists(
        st.tuples(st.integers(0, 255), st.booleans(), st.booleans(), st.binary(max_size=300)), max_size=12
    ),
    cuts=st.lists(st.integers(0, 5000), max_size=20),
)
def test_streamed_bodies_carry_the_same_chunks(
    chunks: list[tuple[int, bool, bool, bytes]], cuts: list[int]
) -> None:
    """With ``stream_bodies`` a chunk may arrive as several pieces: only the last carries
    its termination flag, no piece is empty unless the chunk is (an empty chunk is a
    cancel or a ping), and the pieces join to the chunk's body, whatever the read sizes."""
    n = Negotiated(8, 10)
    stream = b"".join(
        encode_header(n, cid, len(body), response, term) + body for cid, response, term, body in chunks
    )
    reads = [stream[a:b] for a, b in pairwise([0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)])]
    decoder = Decoder(n, stream_bodies=True)
    pieces = [piece for data in reads for piece in decoder.feed(data)]
    assert decoder.pending == 0
    rebuilt: list[tuple[int, bool, bool, bytes]] = []
    body = b""
    for cid, response, term, data in pieces:
        expected = chunks[len(rebuilt)]
        assert (cid, response) == expected[:2]
        body += bytes(data)
        assert len(body) <= len(expected[3])
        if term or (len(body) == len(expected[3]) and not expected[2]):
            rebuilt.append((cid, response, term, body))
            body = b""
        else:
            assert data, "an empty piece would read as a cancel"
    assert rebuilt == chunks
