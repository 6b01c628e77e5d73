"""Every default that the README, SECURITY.md or the documentation states is the code's.

The statements are found where the pages make them: a SessionConfig field in backquotes
followed by its value in parentheses ("`receive_window` (1 MiB)"), after a comma
("`stream_open_timeout`, 75 s", "`max_message_size`, default 1 MiB + 2"), or in the next
cell of a table row ("| `write_buffer_high` / `write_buffer_low` | 256 KiB / high/4 |").
Each value is parsed (sizes, seconds, rates, counts, strings, tuples, per-format values)
and compared with ``SessionConfig()``; ``max_message_size``, whose default depends on the
format, with what each format's engine resolves it to; a compatibility keyword of a format's
typed options (``streamux_response_hold`` ...), with that option's default. (The Defaults
page of the docs is generated from the classes themselves.)"""

from __future__ import annotations

import re
from dataclasses import fields
from pathlib import Path

import pytest

import polymux
from polymux import formats
from polymux.formats import make_engine


ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "SECURITY.md", *sorted((ROOT / "docs").rglob("*.md"))]
PAGES = [p for p in PAGES if "_build" not in p.parts]
CONFIG = polymux.SessionConfig()
FIELDS = {f.name for f in fields(polymux.SessionConfig)}
UNITS = {"": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}

NAMES = r"(?P<names>`\w+`(?:\s*/\s*`\w+`)*)"
STATEMENT = re.compile(
    NAMES + r"(?:\s+seconds)?(?:\s*\(|,\s*|\s*\|\s*)(?:default\s+|offer\s+)?(?P<value>[^)|;]*)"
)
QUANTITY = re.compile(
    r"""(?P<number>\d[\d,]*(?:\.\d+)?)\s*(?P<unit>KiB|MiB|GiB|/s|s\b)?(?:\s*\+\s*(?P<plus>\d+))?
        |(?P<string>"[a-z-]+")
        |(?P<tuple>\(\d+,\s*\d+,\s*\d+\)?)
        |(?P<ratio>high/4)""",
    re.VERBOSE,
)


def _typed_defaults() -> dict[str, object]:
    """The default of the typed option each compatibility keyword sets."""
    out: dict[str, object] = {}
    for fmt in formats.FORMATS:
        for keyword, option in fmt.options.legacy.items():
            out[keyword] = getattr(type(fmt.options)(), option)
    return out


TYPED = _typed_defaults()


def _per_format_max_message_size() -> set[int]:
    sizes = {make_engine(p).max_message_size for p in ("mplex", "multiplex")}
    sizes.add(make_engine("omnistreams").max_message)  # type: ignore[attr-defined]
    return sizes


def _value(m: re.Match[str]) -> object:
    if m.group("string"):
        return m.group("string").strip('"')
    if m.group("tuple"):
        return tuple(int(x) for x in m.group("tuple").strip("()").split(","))
    if m.group("ratio"):
        return None  # write_buffer_low: None means high/4
    number = float(m.group("number").replace(",", ""))
    unit = m.group("unit") or ""
    if unit in ("s", "/s"):
        return number
    value = number * UNITS[unit] + int(m.group("plus") or 0)
    return int(value) if value == int(value) else value


def _statements() -> list[tuple[str, str, object]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in STATEMENT.finditer(text):
            names = re.findall(r"`(\w+)`", m.group("names"))
            if not set(names) <= FIELDS:
                continue
            value = m.group("value")
            where = f"{page.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
            # Per-format values: "mplex 1 MiB, multiplex 16 MiB, omnistreams 1 MiB + 2".
            per_format = re.findall(r"\b(?:mplex|multiplex|omnistreams)\s+(\d[^,]*)", value)
            if per_format and names == ["max_message_size"]:
                for part in per_format:
                    q = QUANTITY.match(part.strip())
                    assert q, (where, part)
                    found.append((where, "max_message_size", _value(q)))
                continue
            parts = [p.strip() for p in value.split(" / ")] if len(names) > 1 else [value.strip()]
            if len(names) > 1 and len(parts) == 1 and " each" in value:
                parts = parts * len(names)
            for name, part in zip(names, parts, strict=False):
                q = QUANTITY.match(part.strip("`"))
                if q:
                    found.append((where, name, _value(q)))
    return found


STATEMENTS = _statements()


def test_the_pages_state_defaults() -> None:
    stated = {name for _where, name, _value in STATEMENTS}
    # The ones a reader looks for first; so the check cannot pass by finding nothing.
    assert {"receive_window", "max_receive_window", "keepalive_interval", "idle_timeout"} <= stated
    assert len(STATEMENTS) >= 40, STATEMENTS
    assert any(w.startswith("README.md") and n == "receive_window" for w, n, _v in STATEMENTS)


@pytest.mark.parametrize(("where", "name", "stated"), STATEMENTS, ids=[f"{w}-{n}" for w, n, _ in STATEMENTS])
def test_stated_default_is_the_code_s(where: str, name: str, stated: object) -> None:
    actual = getattr(CONFIG, name)
    if actual is None and name in TYPED:
        actual = TYPED[name]
    if name == "max_message_size" and actual is None:
        assert stated in _per_format_max_message_size(), f"{where}: {name} stated as {stated!r}"
        return
    assert stated == actual, f"{where}: {name} is stated as {stated!r}, SessionConfig says {actual!r}"
