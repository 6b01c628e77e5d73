"""A module of an extra that is not installed ends in one line naming the extra (exit 1),
never a traceback: pyarrow (captures), dpkt (pcap files), websockets (ws:// endpoints),
uvloop (--uvloop), anyio (polymux.anyio). The library raises MissingExtra, a
ModuleNotFoundError whose message says the same. (scripts/check-extras does it for real,
in virtual environments without them.)"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

import polymux
from polymux.apps.common import EXIT_FAILED
from polymux.cli import main


def hide(monkeypatch: pytest.MonkeyPatch, module: str) -> None:
    """Make ``module`` and its submodules unimportable (as if not installed)."""
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)


@pytest.fixture
def capture(tmp_path: Path) -> Path:
    """A polymux capture of a short yamux session."""
    from polymux.tracing import CaptureRecorder

    async def session(recorder: CaptureRecorder) -> None:
        server = await polymux.start_server(lambda r, w: w.close(), "127.0.0.1", 0, protocol="yamux")
        async with (
            server,
            await polymux.connect("127.0.0.1", server.port, protocol="yamux", capture=recorder),
        ):
            pass

    with CaptureRecorder(tmp_path / "captures") as recorder:
        asyncio.run(session(recorder))
    return recorder.paths[0]


def one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_decode_of_a_capture_without_pyarrow(
    capture: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hide(monkeypatch, "pyarrow")
    assert main(["decode", str(capture)]) == EXIT_FAILED
    assert one_line(capsys) == (
        "polymux decode: decoding a polymux capture needs pyarrow, which is not installed: "
        "pip install 'polymux[capture]'"
    )


def test_decode_of_a_pcap_without_dpkt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pcap = tmp_path / "lo.pcap"
    pcap.write_bytes(bytes.fromhex("d4c3b2a1020004000000000000000000ffff000001000000"))  # header only
    hide(monkeypatch, "dpkt")
    assert main(["decode", str(pcap)]) == EXIT_FAILED
    assert one_line(capsys) == (
        "polymux decode: reading pcap and pcapng files needs dpkt, which is not installed: "
        "pip install 'polymux[pcap]'"
    )


def test_capture_recorder_without_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from polymux.tracing import CaptureRecorder

    hide(monkeypatch, "pyarrow")
    with pytest.raises(polymux.MissingExtra) as info:
        CaptureRecorder(tmp_path)
    assert str(info.value) == (
        "CaptureRecorder (recording polymux captures) needs pyarrow, which is not installed: "
        "pip install 'polymux[capture]'"
    )
    assert isinstance(info.value, ModuleNotFoundError) and info.value.name == "pyarrow"
    assert info.value.extra == "capture"


@pytest.mark.parametrize(
    ("argv", "module", "line"),
    [
        (
            ["bridge", "yamux:tcp:127.0.0.1:0", "omnistreams:ws://127.0.0.1:1/"],
            "websockets",
            (
                "polymux bridge: a bridge with a ws:// endpoint needs websockets, which is not installed: "
                "pip install 'polymux[websockets]'"
            ),
        ),
        (
            ["bridge", "omnistreams:ws://127.0.0.1:0/", "yamux:tcp:127.0.0.1:1"],
            "websockets",
            (
                "polymux bridge: a bridge with a ws:// endpoint needs websockets, which is not installed: "
                "pip install 'polymux[websockets]'"
            ),
        ),
        (
            ["bridge", "yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--capture-listen", "{tmp}"],
            "pyarrow",
            (
                "polymux bridge: CaptureRecorder (recording polymux captures) needs pyarrow, which is not "
                "installed: pip install 'polymux[capture]'"
            ),
        ),
        (
            ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:1", "--uvloop"],
            "uvloop",
            "polymux connect: --uvloop needs uvloop, which is not installed: pip install 'polymux[uvloop]'",
        ),
    ],
)
def test_commands_without_an_extra(
    argv: list[str],
    module: str,
    line: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    hide(monkeypatch, module)
    assert main([a.format(tmp=tmp_path) for a in argv]) == EXIT_FAILED
    assert one_line(capsys) == line


def test_polymux_anyio_without_anyio(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    hide(monkeypatch, "anyio")
    monkeypatch.delitem(sys.modules, "polymux.anyio", raising=False)
    with pytest.raises(polymux.MissingExtra, match=r"pip install 'polymux\[anyio\]'"):
        importlib.import_module("polymux.anyio")
