"""The pure parts of polymux.forward: -L/-R/-D specs, --allow rules, request and reply
lines, reply codes for connection errors, the reconnection backoff."""

from __future__ import annotations

import errno
import random
import re
import socket

import pytest

from polymux.forward import (
    AllowList,
    AllowRule,
    Backoff,
    Forward,
    ForwardError,
    HostPort,
    Reply,
    parse_host_port,
)
from polymux.forward.request import (
    MAX_LINE,
    Request,
    code_for,
    control_line,
    format_reply,
    parse_control,
    parse_reply,
    parse_request,
)


@pytest.mark.parametrize(
    ("kind", "spec", "bind", "target"),
    [
        ("L", "8080:127.0.0.1:80", HostPort("127.0.0.1", 8080), HostPort("127.0.0.1", 80)),
        ("L", "0.0.0.0:8080:db.internal:5432", HostPort("0.0.0.0", 8080), HostPort("db.internal", 5432)),
        ("L", "*:8080:[::1]:22", HostPort("0.0.0.0", 8080), HostPort("::1", 22)),
        ("L", "[::1]:0:[2001:db8::5]:443", HostPort("::1", 0), HostPort("2001:db8::5", 443)),
        ("L", "9000", HostPort("127.0.0.1", 9000), None),
        ("L", "localhost:9000", HostPort("localhost", 9000), None),
        ("R", "8080:127.0.0.1:80", HostPort("127.0.0.1", 8080), HostPort("127.0.0.1", 80)),
        ("D", "1080", HostPort("127.0.0.1", 1080), None),
        ("D", "[::1]:1080", HostPort("::1", 1080), None),
    ],
)
def test_forward_specs_as_ssh_writes_them(
    kind: str, spec: str, bind: HostPort, target: HostPort | None
) -> None:
    fwd = Forward.parse(kind, spec)
    assert (fwd.kind, fwd.bind, fwd.target) == (kind, bind, target)


@pytest.mark.parametrize(
    ("kind", "spec", "says"),
    [
        ("L", "", "expected a port"),
        ("L", "70000:h:1", "expected a port in 0..65535"),
        ("L", "8080:h:0", "expected a port in 1..65535"),
        ("L", "1:2:3:4:5", "expected [BIND:]PORT"),
        ("L", "8080:80", "not a bind address"),
        ("L", "8080:bad host:80", "not a host name"),
        ("R", "8080", "HOST:HOSTPORT"),
        ("D", "1080:h:80", "expected [BIND:]PORT"),
        ("X", "1", "unknown forward kind"),
    ],
)
def test_bad_specs_say_what_is_wrong(kind: str, spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        Forward.parse(kind, spec)


def test_describe_is_the_listening_line() -> None:
    assert Forward.parse("L", "8080:10.0.0.5:80").describe() == "-L 127.0.0.1:8080 -> 10.0.0.5:80"
    assert Forward.parse("L", "8080").describe() == "-L 127.0.0.1:8080 -> the far end's --to"
    assert Forward.parse("D", "[::1]:1080").describe() == "-D [::1]:1080 (SOCKS5)"
    assert str(parse_host_port("[::1]:22")) == "[::1]:22"
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_host_port("::1:22")


def test_allow_rules() -> None:
    rules = AllowList.parse(["db.internal:5432", "10.0.0.0/8:22", "[fd00::/8]:*", "*:8000-8099", "web:*"])
    assert rules.by_name("db.internal", 5432) and rules.by_name("DB.Internal.", 5432)
    assert not rules.by_name("db.internal", 5433)
    assert rules.by_name("10.1.2.3", 22) and not rules.by_name("10.1.2.3", 23)
    assert rules.by_name("fd00::1", 9) and rules.by_name("::ffff:10.0.0.1", 22)
    assert rules.by_name("anything", 8050) and not rules.by_name("anything", 8100)
    assert rules.by_name("web", 1)
    # A name is resolved only where a network rule could allow it: a refused name is never looked up.
    assert rules.needs_addresses("ssh.internal", 22)
    narrow = AllowList.parse(["10.0.0.0/8:22", "web:*"])
    assert not narrow.needs_addresses("ssh.internal", 23) and not narrow.needs_addresses("web", 23)
    assert not rules.needs_addresses("10.1.2.3", 22)
    assert rules.by_address("10.9.9.9", 22) and not rules.by_address("192.168.1.1", 22)
    assert AllowList.parse(["*"]).by_name("x", 1)
    assert not AllowList() and not AllowList().by_name("x", 1)
    assert AllowRule.parse("127.0.0.1:80").network is not None  # an address is a /32


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("host", "expected \\*, HOST:PORT"),
        ("host:x", "expected a port"),
        ("host:90-80", "is empty"),
        ("10.0.0.1/8:22", "not a CIDR network"),
        ("bad host:1", "not a host name"),
    ],
)
def test_bad_rules_say_what_is_wrong(spec: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        AllowRule.parse(spec)


def test_request_lines_round_trip_and_are_bounded() -> None:
    line = Request("CONNECT", HostPort("::1", 22)).encode()
    assert line == b"PMXF/1 CONNECT ::1 22\n"
    assert parse_request(line) == Request("CONNECT", HostPort("::1", 22))
    assert parse_request(Request("CONTROL").encode()).verb == "CONTROL"
    accepted = parse_request(Request("ACCEPTED", HostPort("127.0.0.1", 5555), 3).encode())
    assert (accepted.listener, accepted.target) == (3, HostPort("127.0.0.1", 5555))
    for bad, code in [
        (b"GET / HTTP/1.1\n", Reply.COMMAND_NOT_SUPPORTED),
        (b"PMXF/1 BIND x 1\n", Reply.COMMAND_NOT_SUPPORTED),
        (b"PMXF/1 CONNECT bad\x01host 1\n", Reply.GENERAL_FAILURE),
        (b"PMXF/1 CONNECT host 0\n", Reply.ADDRESS_TYPE_NOT_SUPPORTED),
        (b"PMXF/1 CONNECT " + b"a" * MAX_LINE + b" 1\n", Reply.GENERAL_FAILURE),
        (b"PMXF/1 CONNECT h\xff 1\n", Reply.GENERAL_FAILURE),
    ]:
        with pytest.raises(ForwardError) as caught:
            parse_request(bad)
        assert caught.value.code == code, bad


def test_replies() -> None:
    assert parse_reply(format_reply(Reply.SUCCEEDED, where=HostPort("10.0.0.1", 40000))) == HostPort(
        "10.0.0.1", 40000
    )
    assert parse_reply(b"OK\n") is None
    with pytest.raises(ForwardError, match="connection refused") as caught:
        parse_reply(format_reply(Reply.CONNECTION_REFUSED, "connection refused"))
    assert caught.value.code == Reply.CONNECTION_REFUSED
    long = format_reply(Reply.GENERAL_FAILURE, "x\n" * 2000)
    assert len(long) == MAX_LINE and long.count(b"\n") == 1
    with pytest.raises(ForwardError, match="not a forward reply"):
        parse_reply(b"HTTP/1.0 200 OK\r\n")
    assert parse_control(control_line("REFUSED", 2, 2, "no -R here")) == ("REFUSED", ["2", "2", "no -R here"])
    assert parse_control(control_line("LISTEN", 1, "::1", 0)) == ("LISTEN", ["1", "::1", "0"])
    with pytest.raises(ForwardError):
        parse_control(b"LISTEN 1 x\n")


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), Reply.CONNECTION_REFUSED),
        (OSError(errno.ENETUNREACH, "unreachable"), Reply.NETWORK_UNREACHABLE),
        (OSError(errno.EHOSTUNREACH, "no route"), Reply.HOST_UNREACHABLE),
        (socket.gaierror(socket.EAI_NONAME, "unknown"), Reply.HOST_UNREACHABLE),
        (TimeoutError(), Reply.TTL_EXPIRED),
        (OSError(errno.ETIMEDOUT, "timed out"), Reply.TTL_EXPIRED),
        (ForwardError("no", Reply.NOT_ALLOWED), Reply.NOT_ALLOWED),
        (RuntimeError("?"), Reply.GENERAL_FAILURE),
    ],
)
def test_reply_codes_for_connection_errors(error: BaseException, code: Reply) -> None:
    assert code_for(error) == code


def test_backoff_is_jittered_and_capped() -> None:
    backoff = Backoff(initial=0.5, maximum=8.0)
    rng = random.Random(1)
    delays = [[backoff.delay(attempt, rng) for attempt in range(1, 12)] for _ in range(50)]
    for run in delays:
        for attempt, delay in enumerate(run, 1):
            base = min(8.0, 0.5 * 2 ** (attempt - 1))
            assert base / 2 <= delay <= base
    assert len({run[5] for run in delays}) > 40  # jittered: near ends cut at once spread out
    with pytest.raises(ValueError, match="initial <= maximum"):
        Backoff(initial=5, maximum=1)
