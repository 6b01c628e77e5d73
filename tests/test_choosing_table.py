"""The side-by-side table of docs/choosing.md ("Which format should I use?") is the
registry's: one row per format of ``polymux.formats.FORMATS``, in its order, and the first
word of the flow-control, names, half-close, reset and pings cells is what the format's
``Capabilities`` say (a format added or changed without its row fails here). The lists of
formats with and without credit in the page's guidance are the registry's too."""

from __future__ import annotations

import re
from pathlib import Path

from polymux import formats


PAGE = Path(__file__).resolve().parents[1] / "docs" / "choosing.md"
HEADER = (
    "| `protocol=` | tested against | flow control on the wire | channel names | half-close "
    "| reset reason | pings / keepalive | limits of the format |"
)


def _rows() -> list[list[str]]:
    lines = PAGE.read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def _first_word(cell: str) -> str:
    return re.split(r"[\s:,]", cell, maxsplit=1)[0]


def test_one_row_per_format_in_the_registry_s_order() -> None:
    names = [re.search(r"`([\w-]+)`", row[0]).group(1) for row in _rows()]  # type: ignore[union-attr]
    assert names == [fmt.name for fmt in formats.FORMATS]
    assert all(len(row) == 8 for row in _rows())


def test_the_cells_say_what_the_capabilities_say() -> None:
    def yes(flag: bool) -> str:
        return "yes" if flag else "no"

    for row, fmt in zip(_rows(), formats.FORMATS, strict=True):
        caps = fmt.caps
        got = [_first_word(row[i]) for i in (2, 3, 4, 5, 6)]
        expected = [
            caps.credit or "none",
            yes(caps.names),
            yes(caps.half_close),
            yes(caps.reset_message),
            yes(caps.ping),
        ]
        assert got == expected, (fmt.name, got, expected)


def test_the_guidance_lists_the_registry_s_formats() -> None:
    text = " ".join(PAGE.read_text().split())
    with_credit = ", ".join(f"`{f.name}`" for f in formats.FORMATS if f.caps.credit is not None)
    without = ", ".join(f"`{f.name}`" for f in formats.FORMATS if f.caps.credit is None)
    assert f"({with_credit})" in text
    assert f"({without})" in text
