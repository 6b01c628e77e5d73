"""One size syntax for every size option of every command and example: units everywhere,
a number without a unit means bytes everywhere, and values below a sane minimum are
refused with an error that says so (and, for a bare number, what the unit would be)."""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

import pytest

from polymux.apps.common import EXIT_USAGE, MIN_WINDOW, parse_size, size_type
from polymux.cli import build_parser, main


ROOT = Path(__file__).resolve().parents[2]

# Every file that declares command-line options.
SOURCES = sorted(
    [
        *(ROOT / "src/polymux/cli").glob("*.py"),
        ROOT / "src/polymux/apps/common.py",
        *(ROOT / "examples").rglob("*.py"),
        ROOT / "benchmarks/suite.py",
    ]
)
SIZE_WORDS = ("size", "window", "buffer", "memory", "rate", "total", "chunk", "upload", "mib")


def _size_options(path: Path) -> list[tuple[str, ast.Call]]:
    """``(option, call)`` of every ``add_argument`` whose option name is about a size."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if any(n.startswith("--") and any(w in n for w in SIZE_WORDS) for n in names):
                found.append((names[0], node))
    return found


def test_every_size_option_goes_through_the_one_parser() -> None:
    checked = []
    for path in SOURCES:
        for option, call in _size_options(path):
            keywords = {k.arg: k.value for k in call.keywords}
            help_node = keywords.get("help")
            if isinstance(help_node, ast.Attribute) and help_node.attr == "SUPPRESS":
                continue  # an old spelling whose unit is in its name (--bulk-mib), not shown
            kind = keywords.get("type")
            text = ast.unparse(kind) if kind is not None else "str"
            assert text == "size" or text.startswith("size_type("), f"{path.name} {option}: type={text}"
            checked.append(option)
    assert {"--size", "--window", "--chunk", "--total", "--max-session-memory", "--write-buffer"} <= set(
        checked
    )
    assert {"--limit-rate", "--max-size", "--max-upload", "--bulk-size", "--slow-size"} <= set(checked)


def _options(argv: list[str]) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def test_a_number_without_a_unit_means_bytes_in_every_command() -> None:
    assert _options(["connect", "--protocol", "yamux", "--tcp", "h:1", "--size", "8"]).size == 8
    assert _options(["demo", "--size", "8192"]).total == 8192  # was 8192 MiB
    assert _options(["demo", "--total", "8192"]).total == 8192
    assert _options(["demo", "--size", "8MiB"]).total == 8 << 20  # was "invalid float value"
    assert _options(["bench", "--bulk-size", "2097152"]).bulk_size == 2 << 20


@pytest.mark.parametrize(
    "argv",
    [
        ["connect", "--protocol", "yamux", "--tcp", "127.0.0.1:1", "--window", "1"],
        ["serve", "--protocol", "yamux", "--tcp", "127.0.0.1:0", "--window", "1"],
        ["bridge", "yamux:tcp:127.0.0.1:0", "mplex:tcp:127.0.0.1:1", "--window", "1"],
    ],
)
def test_a_window_below_the_minimum_is_refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        "argument --window: '1' is 1 B, below the minimum of 4.0 KiB; a number without a unit means "
        "bytes (did you mean 1MiB?)"
    ) in err, err


def test_the_demo_size_in_its_old_meaning_says_what_it_means_now(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--size", "8"])
    assert exit_info.value.code == EXIT_USAGE
    assert "'8' is 8 B, below the minimum of 1.0 KiB; a number without a unit means bytes (did you mean " in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize(
    ("text", "minimum", "error"),
    [
        ("1.5", 1, "not a whole number of bytes: '1.5' (give a unit: 1.5MiB, 1.5GiB)"),
        ("0", 1, "'0' is 0 B, below the minimum of 1 B; a number without a unit means bytes"),
        ("2KiB", MIN_WINDOW, "'2KiB' is 2.0 KiB, below the minimum of 4.0 KiB"),
        ("100B", 1024, "'100B' is 100 B, below the minimum of 1.0 KiB"),
    ],
)
def test_errors_say_what_is_wrong(text: str, minimum: int, error: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(text, minimum=minimum)
    assert str(info.value) == error


def test_units_are_binary_in_every_spelling() -> None:
    for text in ("1M", "1MB", "1MiB", "1mib", "1024K", "1024KiB", "1048576", "1048576B", "0.5GiB"):
        assert parse_size(text) in (1 << 20, 1 << 29), text
    assert size_type(4096)("4KiB") == 4096
