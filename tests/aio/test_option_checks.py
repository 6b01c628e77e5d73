"""Options without traps (issue 40 item 9): an option a format cannot honour is refused
with the format's own option named, or applied; another format's compatibility keyword is
refused, not ignored; a misspelt keyword gets the closest names; and the keywords are typed
(a TypedDict under ``Unpack``), so a type checker catches a typo before it runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

import polymux
import polymux.anyio as pmanyio
from polymux import SessionConfig, formats
from polymux.cli import main
from polymux.formats import YamuxOptions


pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


async def test_receive_window_below_yamuxs_first_window_is_refused() -> None:
    """The issue's case: 64 KiB on yamux did nothing (the peer may always send 256 KiB)."""
    with pytest.raises(
        ValueError, match=r"^yamux cannot honour receive_window=65536: .*max_receive_window"
    ) as info:
        await polymux.start_server(None, "127.0.0.1", 0, protocol="yamux", receive_window=64 * 1024)
    assert "256 KiB" in str(info.value)
    with pytest.raises(ValueError, match="yamux cannot honour receive_window"):
        await polymux.connect("127.0.0.1", 1, protocol="yamux", config=SessionConfig(receive_window=65536))
    with pytest.raises(ValueError, match="yamux cannot honour receive_window"):
        formats.resolve("yamux", SessionConfig(receive_window=128 * 1024))


def test_receive_window_from_256_kib_on_is_applied_as_the_most_a_window_grows_to() -> None:
    """4 MiB on yamux caps the streams' windows at 4 MiB (they grew to 16 MiB whatever it
    said); the typed option, when set, wins; the default changes nothing."""
    assert formats.resolve("yamux", SessionConfig(receive_window=4 << 20)).options == YamuxOptions(
        max_receive_window=4 << 20
    )
    explicit = formats.get("yamux").configure(max_receive_window=8 << 20)
    assert (
        formats.resolve(explicit, SessionConfig(receive_window=4 << 20)).options.max_receive_window == 8 << 20
    )  # type: ignore[attr-defined]
    assert formats.resolve(
        "yamux", SessionConfig(receive_window=4 << 20, max_receive_window=2 << 20)
    ).options == YamuxOptions(max_receive_window=2 << 20)
    assert formats.resolve("yamux", SessionConfig()) is formats.get("yamux")


async def test_an_option_of_another_format_is_refused() -> None:
    with pytest.raises(
        ValueError,
        match=r"^max_receive_window is an option of yamux \(YamuxOptions\.max_receive_window\): mplex has no such setting",
    ):
        await polymux.start_server(None, "127.0.0.1", 0, protocol="mplex", max_receive_window=1 << 20)
    with pytest.raises(ValueError, match=r"^streamux_early_responses is an option of streamux"):
        formats.resolve("yamux", SessionConfig(streamux_early_responses=True))
    with pytest.raises(ValueError, match=r"^smux_peer_buffer is an option of smux"):
        formats.resolve("mstream-v3", SessionConfig(smux_peer_buffer=1 << 20))
    assert (
        formats.resolve("omnistreams", SessionConfig(omnistreams_numbering="legacy")).name
        == "omnistreams-legacy"
    )


async def test_the_anyio_session_refuses_them_too() -> None:
    left, _right = anyio.create_memory_object_stream[bytes](1)
    with pytest.raises(ValueError, match="yamux cannot honour receive_window"):
        async with pmanyio.session(left, protocol="yamux", receive_window=64 * 1024):  # type: ignore[arg-type]
            pass


async def test_a_typo_gets_the_closest_names() -> None:
    with pytest.raises(TypeError) as info:
        await polymux.connect("127.0.0.1", 1, protocol="yamux", keepalive=5)  # type: ignore[call-arg]
    assert str(info.value) == (
        "unknown session option 'keepalive'; did you mean 'keepalive_interval' or 'keepalive_timeout'?"
    )
    with pytest.raises(
        TypeError,
        match=r"unknown session option 'recieve_window'; did you mean 'receive_window' or 'max_receive_window'\?",
    ):
        await polymux.start_server(None, "127.0.0.1", 0, protocol="yamux", recieve_window=1 << 20)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"^unknown session option 'zzz'$"):
        SessionConfig.from_options(zzz=1)
    with pytest.raises(
        TypeError, match=r"streamux has no option early_response; did you mean 'early_responses'\?"
    ):
        formats.get("streamux").configure(early_response=True)


def test_the_commands_refuse_them_with_exit_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:9", "--window", "64KiB"])
    assert info.value.code == 2
    assert "--window: yamux cannot honour receive_window=65536" in capsys.readouterr().err


def test_the_keywords_are_typed(tmp_path: Path) -> None:
    """mypy --strict sees a misspelt option and a value of the wrong type."""
    code = tmp_path / "uses.py"
    code.write_text(
        textwrap.dedent(
            """
            import polymux

            async def main() -> None:
                await polymux.connect("h", 1, protocol="yamux", keepalive=5)
                await polymux.start_server(None, "h", 1, protocol="yamux", receive_window="big")
                await polymux.connect("h", 1, protocol="yamux", receive_window=1 << 20, ssl=None)
            """
        )
    )
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", "--python-version", "3.11", str(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
    )
    out = proc.stdout
    assert 'Unexpected keyword argument "keepalive"' in out, out
    assert 'Argument "receive_window" to "start_server" has incompatible type "str"' in out, out
    assert "uses.py:7" not in out, out  # the good call passes
    assert proc.returncode == 1 and out.count("error:") == 2, out
