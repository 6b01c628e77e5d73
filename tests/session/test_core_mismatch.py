"""A violation in the peer's very first bytes is a FormatMismatch: the peer probably speaks
another protocol, and the error says what it sent (HTTP, TLS, SSH by name), not only what
broke ("NewStream for stream 0, which the peer already has open"). Later violations, and
flow-control overruns (which take frames of the format), stay what they are."""

from __future__ import annotations

from polymux.config import SessionConfig
from polymux.exceptions import FlowControlError, FormatMismatch, ProtocolError
from polymux.formats import make_engine
from polymux.session import SessionCore, events as ce
from polymux.wire import mstream

from .test_core import pair, pump


def server(fmt: str, **options: object) -> SessionCore:
    config = SessionConfig(**options)  # type: ignore[arg-type]
    core = SessionCore(make_engine(fmt, config, is_client=False), config, 0.0, has_handler=True)
    core.connection_made(0.0)
    core.data_to_send()
    return core


def test_an_http_request_to_a_yamux_server() -> None:
    core = server("yamux")
    core.receive_data(b"GET / HTTP/1.1\r\nHost: example\r\n\r\n", 0.0)
    error = core.error
    assert isinstance(error, FormatMismatch) and error.foreign == "HTTP"
    assert str(error).startswith(
        "yamux: the peer speaks HTTP, not yamux: it sent an HTTP request (GET /), so it is an HTTP client "
        "(as yamux: frame header version is 71, expected 0)"
    )
    assert error.first_bytes == b"GET / HTTP/1.1\r\nHost: example\r\n\r\n"
    assert isinstance(error.__cause__, ProtocolError)
    assert [e for e in core.events() if isinstance(e, ce.Failed)] == [ce.Failed(error)]


def client(fmt: str) -> SessionCore:
    config = SessionConfig()
    core = SessionCore(make_engine(fmt, config, is_client=True), config, 0.0, is_client=True)
    core.connection_made(0.0)
    core.data_to_send()
    return core


def test_bytes_of_another_format_name_it() -> None:
    """A client's session names the format its server speaks, with the format registry's
    detector (issue 40 item 7)."""
    core = client("mplex")
    core.receive_data(bytes.fromhex("000200010000000000000001"), 0.0)  # a yamux server's ping
    error = core.error
    assert isinstance(error, FormatMismatch) and error.foreign is None
    assert str(error) == (
        "mplex: the peer speaks yamux, not mplex (confidence 0.95: 1 yamux frame, the first: ping on stream 0 "
        "(a yamux ping: 8 of its 12 bytes are fixed)); run both sides with the same format (protocol='yamux') "
        "(it sent 00 02 00 01 00 00 00 00 00 00 00 01; as mplex: NewStream for stream 0, which the peer "
        "already has open)"
    )
    assert error.diagnosis == error.detail


def test_a_servers_sessions_do_not_run_the_detector() -> None:
    """A server's junk connections stay cheap: what the bytes are (HTTP ...) but no
    detection over every format (about a millisecond each)."""
    core = server("mplex")
    core.receive_data(bytes.fromhex("000200010000000000000001"), 0.0)
    assert isinstance(core.error, FormatMismatch)
    assert str(core.error).startswith("mplex: the peer's first bytes are not mplex: it probably speaks")


def test_bytes_of_something_else() -> None:
    core = server("mplex")
    core.receive_data(bytes.fromhex("07ffffffff"), 0.0)  # flag 7: fits no format
    error = core.error
    assert isinstance(error, FormatMismatch) and error.foreign is None
    assert str(error).startswith(
        "mplex: the peer's first bytes are not mplex: it probably speaks another protocol or another "
        "multiplexing format (it sent 07 ff ff ff ff; as mplex: "
    )


def test_the_first_bytes_kept_are_a_few() -> None:
    core = server("yamux")
    # A yamux data frame opening stream 1 (256 bytes, 28 of them here): no violation yet ...
    core.receive_data(bytes.fromhex("000000010000000100000100") + bytes(28), 0.0)
    core.receive_data(b"SSH-2.0-x\r\n" * 30, 0.0)  # ... until the header after it
    assert core.error is not None
    assert isinstance(core.error, FormatMismatch) and len(core.error.first_bytes) == 64


def test_a_violation_after_the_first_bytes_stays_a_protocol_error() -> None:
    a, b = pair("yamux")
    handle = a.open_channel("x")
    a.write(handle, bytes(8192))
    pump(a, b)
    assert b.error is None
    b.receive_data(b"\x07" * 12, 0.0)
    assert type(b.error) is ProtocolError


def test_a_flow_control_overrun_stays_what_it_is() -> None:
    b = server("mstream-v3", receive_window=300)
    offer = mstream.encode_frame(
        3, mstream.Frame(mstream.ControlCode.OFFER, 1, b"", mstream.ChannelSource.LOCAL)
    )
    b.receive_data(offer, 0.0)
    b.events()
    content = mstream.Frame(mstream.ControlCode.CONTENT, 1, bytes(301), mstream.ChannelSource.LOCAL)
    b.receive_data(mstream.encode_frame(3, content), 0.0)
    assert isinstance(b.error, FlowControlError) and not isinstance(b.error, FormatMismatch)


def test_a_connection_that_ends_inside_its_first_frame() -> None:
    core = server("mplex")
    core.receive_data(b"HTTP/1.1 400 Bad", 0.0)  # as mplex: a frame of 84 bytes, cut short
    assert core.error is None
    core.receive_eof()
    assert isinstance(core.error, FormatMismatch) and core.error.foreign == "HTTP"
    assert "(as mplex: " in str(core.error)
