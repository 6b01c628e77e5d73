"""The options' documentation where users read it (issue 40 item 11): docs/defaults.md
holds its tables as Markdown (readable in the repository, not an unexpanded directive),
made from the code and checked against it here; help(SessionConfig) gives a line per field
with its default; the keepalive's docstring names the formats that send keepalives, as the
format pages do."""

from __future__ import annotations

import pydoc
import re
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import polymux
from polymux import SessionConfig, formats


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))
import polymux_docs  # the docs' own generator


def test_the_defaults_page_is_readable_markdown_made_from_the_code() -> None:
    page = (ROOT / "docs" / "defaults.md").read_text()
    assert "{polymux-defaults}" not in page and "{polymux-format-options}" not in page
    sections = dict(m.group(2, 3) for m in polymux_docs.GENERATED.finditer(page))
    assert set(sections) == {"defaults", "format-options"}
    assert polymux_docs.regenerate(page) == page, "run python docs/_ext/polymux_docs.py"
    for field in fields(SessionConfig):
        assert f"| `{field.name}` |" in sections["defaults"], field.name
    assert "| `StreamuxOptions.early_responses` |" in sections["format-options"]


def test_help_gives_a_line_per_option() -> None:
    rendered = pydoc.render_doc(SessionConfig, renderer=pydoc.plaintext)
    text = " ".join(line.lstrip(" |") for line in rendered.splitlines())
    text = " ".join(text.split())
    docs = polymux_docs._field_docs(SessionConfig)
    for field in fields(SessionConfig):
        default = field.default if field.default is not MISSING else None
        first = re.split(r"(?<=[.!?])\s", polymux_docs._plain(docs[field.name]), maxsplit=1)[0]
        line = f"{field.name} ({polymux_docs.describe_default(field.name, default)}): {first}"
        assert " ".join(line.split()) in text, field.name


def test_the_keepalive_docstring_names_the_formats_with_keepalives() -> None:
    """It said yamux and Streamux; smux sends keepalives too (its NOP, formats/smux.md).
    The formats without pings are named as those where polymux sends heartbeats instead."""
    doc = " ".join(polymux_docs._field_docs(SessionConfig)["keepalive_interval"].lower().split())
    with_pings = {fmt.family.split("-")[0] for fmt in formats.FORMATS if fmt.caps.ping}
    without = {fmt.family.split("-")[0] for fmt in formats.FORMATS if not fmt.caps.ping} - with_pings
    assert with_pings == {"yamux", "streamux", "smux"}
    pinging = re.search(r"formats with pings: ([^;]*)", doc)
    heartbeats = re.search(r"formats without pings \(([^)]*)\)", doc)
    assert pinging and heartbeats, doc
    assert all(name in pinging.group(1) for name in with_pings), doc
    assert not any(name in pinging.group(1) for name in without), doc
    spelled = {"mstream": "multiplexingstream"}  # the docs' name of the family
    assert all(spelled.get(name, name) in heartbeats.group(1) for name in without), doc
    assert not any(name in heartbeats.group(1) for name in with_pings), doc
    assert "keepalive_interval" in (ROOT / "docs" / "formats" / "smux.md").read_text()
    assert polymux.SessionConfig().keepalive_interval == 15.0
