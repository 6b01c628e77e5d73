"""The install page (docs/install.md) covers pyproject.toml's extras: its extras table has
one row per extra, and names each package the extra brings (so an extra added or changed
without its row fails here); its cost table has a measured row per extra."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PAGE = (ROOT / "docs" / "install.md").read_text()
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]


def _table(header: str) -> dict[str, str]:
    """The rows of the table whose header line starts with ``header``: first cell -> row."""
    lines = PAGE.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = line
    return rows


def _package(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0]


def test_every_extra_has_a_row_naming_what_it_brings() -> None:
    rows = _table("| extra | brings |")
    assert set(rows) - {"(none)"} == {f"`{name}`" for name in EXTRAS}
    for name, requirements in EXTRAS.items():
        if name == "dev":
            continue  # 'every extra above, plus ...'
        for requirement in requirements:
            assert _package(requirement) in rows[f"`{name}`"], (name, requirement)


def test_every_extra_has_a_measured_cost() -> None:
    rows = _table("| install | seconds |")
    assert {f"`.[{name}]`" for name in EXTRAS} <= set(rows)
