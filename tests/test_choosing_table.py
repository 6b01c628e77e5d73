"""The side-by-side table of docs/choosing.md ("Which format should I use?") is the
registry's: the page generates it (``polymux-formats choosing``) with one row per format of
``polymux.formats.FORMATS``, in its order, and the first word of the flow-control, names,
half-close, reset and pings cells is what the format's ``Capabilities`` say. The lists of
formats with and without credit in the page's guidance are the registry's too."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from polymux import formats


DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "choosing.md"
sys.path.insert(0, str(DOCS / "_ext"))

from polymux_docs import format_table


def test_the_page_generates_the_table() -> None:
    assert "```{polymux-formats} choosing\n```" in PAGE.read_text()


def _rows() -> list[list[str]]:
    lines = format_table("choosing", "choosing")
    return [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in lines[2:]]


def _first_word(cell: str) -> str:
    return re.split(r"[\s:,]", cell, maxsplit=1)[0]


def test_one_row_per_format_in_the_registry_s_order() -> None:
    names = [re.search(r"`([\w-]+)`", row[0]).group(1) for row in _rows()]  # type: ignore[union-attr]
    assert names == [fmt.name for fmt in formats.FORMATS]
    assert all(len(row) == 8 for row in _rows())
    # Each format links to its page, has a reference and limits.
    for row, fmt in zip(_rows(), formats.FORMATS, strict=True):
        assert row[0] == f"[`{fmt.name}`]({fmt.docs.page})"
        assert (DOCS / fmt.docs.page).is_file()
        assert row[1] and row[7]


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
