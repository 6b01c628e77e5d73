"""The format capability table of docs/bridge.md is the registry's: the page generates it
(``polymux-formats capabilities``) with one row per format of ``polymux.formats.FORMATS``,
in its order, each cell what the format's ``Capabilities`` say."""

from __future__ import annotations

import sys
from pathlib import Path

from polymux import formats


DOCS = Path(__file__).resolve().parents[2] / "docs"
PAGE = DOCS / "bridge.md"
COLUMNS = ["`protocol=`", "names", "credit", "half-close", "reset text", "one-way streams", "pings"]
sys.path.insert(0, str(DOCS / "_ext"))

from polymux_docs import format_table


def test_the_page_generates_the_table() -> None:
    assert "```{polymux-formats} capabilities\n```" in PAGE.read_text()


def _table() -> list[list[str]]:
    """The rows of the generated table (cells stripped), after checking its header."""
    lines = format_table("capabilities", "bridge")
    assert lines[0] == "| " + " | ".join(COLUMNS) + " |"
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]


def _expected(fmt: formats.Format) -> list[str]:
    caps = fmt.caps

    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    return [
        f"`{fmt.name}`",
        yes(caps.names),
        caps.credit or "none",
        yes(caps.half_close),
        yes(caps.reset_message),
        yes(caps.one_way),
        yes(caps.ping),
    ]


def test_the_capability_table_is_the_registry() -> None:
    assert _table() == [_expected(fmt) for fmt in formats.FORMATS]


def test_the_page_names_credit_less_formats_as_the_registry_does() -> None:
    """The backpressure section lists the formats without credit: the registry's."""
    text = " ".join(PAGE.read_text().split())
    without = [f"`{fmt.name}`" for fmt in formats.FORMATS if fmt.caps.credit is None]
    assert f"**Formats without credit** ({', '.join(without)})" in text
