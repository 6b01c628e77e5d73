"""The format capability table of docs/bridge.md is the registry's: one row per format of
``polymux.formats.FORMATS``, in its order, each cell what the format's ``Capabilities``
say (a format added or changed without its row fails here)."""

from __future__ import annotations

from pathlib import Path

from polymux import formats


PAGE = Path(__file__).resolve().parents[2] / "docs" / "bridge.md"
COLUMNS = ["`protocol=`", "names", "credit", "half-close", "reset text", "one-way streams", "pings"]


def _table() -> list[list[str]]:
    """The rows of the table whose header is COLUMNS (cells stripped)."""
    lines = PAGE.read_text().splitlines()
    header = "| " + " | ".join(COLUMNS) + " |"
    start = lines.index(header)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


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
