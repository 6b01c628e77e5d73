"""Sphinx directives that generate pages from the code, so that they cannot drift from it.

``polymux-cli``: the reference of the ``polymux`` command, one section per subcommand,
built from the argparse parsers (usage, description, options with defaults, and the
exit-status table that ends every ``--help``).

``polymux-defaults``: every ``SessionConfig`` field with its default and its docstring,
read from the class; ``polymux-format-options``: every registered format's typed options
(``StreamuxOptions`` ...), with their defaults and the compatibility keywords that set them.

``polymux-formats``: a table of the registered formats (``choosing``: side by side;
``capabilities``: what the bridge keeps; ``index``: the format pages), one row per format
of the registry (``polymux.formats.FORMATS``), in its order, its cells the format's
``Capabilities`` and ``FormatDocs``: a format registered is in every table.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import posixpath
import re
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import MISSING, fields
from pathlib import Path
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
from docutils.statemachine import StringList
from sphinx.application import Sphinx


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _section(document: Any, title: str, ident: str) -> nodes.section:
    section = nodes.section(ids=[ident], names=[nodes.fully_normalize_name(title)])
    section += nodes.title(text=title)
    document.note_implicit_target(section)
    return section


def _literal(text: str) -> nodes.literal_block:
    """Terminal text, shown as it is (no syntax colouring)."""
    block = nodes.literal_block(text, text)
    block["language"] = "text"
    return block


def _paragraphs(text: str) -> list[nodes.Node]:
    """Plain help text (as --help prints it) as paragraphs; indented runs stay literal."""
    out: list[nodes.Node] = []
    for block in re.split(r"\n\s*\n", textwrap.dedent(text).strip()):
        lines = block.splitlines()
        if all(line.startswith(" ") for line in lines):
            out.append(_literal(textwrap.dedent(block)))
        else:
            out.append(nodes.paragraph(text=" ".join(line.strip() for line in lines)))
    return out


def _options(parser: argparse.ArgumentParser) -> nodes.definition_list:
    items = nodes.definition_list()
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        if action.option_strings:
            metavar = ""
            if action.nargs != 0:
                metavar = " " + str(action.metavar or action.dest.upper())
            term = ", ".join(opt + metavar for opt in action.option_strings)
        else:
            term = str(action.metavar or action.dest)
        help_text = (action.help or "") % {"default": action.default, "prog": parser.prog}
        if action.choices is not None and action.option_strings != ["-h", "--help"]:
            choices = ", ".join(str(c) for c in action.choices)
            if choices not in help_text:
                help_text += f" (one of: {choices})"
        if action.required:
            help_text += " (required)"
        item = nodes.definition_list_item()
        item += nodes.term("", "", nodes.literal(text=term))
        definition = nodes.definition()
        definition += nodes.paragraph(text=help_text)
        item += definition
        items += item
    return items


class CliReference(Directive):
    """``polymux-cli``: one section per ``polymux`` subcommand."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from polymux.apps.common import EXIT_STATUS
        from polymux.cli import build_parser

        document = self.state.document
        parser = build_parser()
        out: list[nodes.Node] = []
        top = _section(document, "polymux", "cli-polymux")
        top += _literal(parser.format_usage().strip())
        top += _paragraphs(parser.description or "")
        top += _literal(EXIT_STATUS)
        out.append(top)
        for name, sub in _subcommands(parser).items():
            section = _section(document, f"polymux {name}", f"cli-{name}")
            section += _literal(sub.format_usage().strip())
            section += _paragraphs(sub.description or "")
            section += _options(sub)
            out.append(section)
        return out


def _plain(text: str) -> str:
    """A docstring as one plain paragraph: roles and literals lose their markup
    (:class:`~a.B` -> B, ``x`` -> x)."""
    text = " ".join(text.split())
    text = re.sub(r":\w+:`~?([^`]*?)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "")


def _class_source(cls: type) -> ast.ClassDef:
    """``cls``'s definition, parsed from its module's Python source: also for a module of
    the compiled data plane, whose classes ``inspect`` cannot find a source for (the .py
    twin is beside the extension)."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        node = tree.body[0]
    except (OSError, TypeError):
        module_file = Path(sys.modules[cls.__module__].__file__ or "")
        source = module_file.with_name(module_file.name.split(".", 1)[0] + ".py")
        tree = ast.parse(source.read_text(encoding="utf-8"))
        found = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
        if not found:
            raise LookupError(f"no class {cls.__name__} in {source}") from None
        node = found[0]
    assert isinstance(node, ast.ClassDef), node
    return node


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (the string literal after it)."""
    body = _class_source(cls).body
    docs: dict[str, str] = {}
    for node, nxt in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[node.target.id] = nxt.value.value
    return docs


_BYTES = ("window", "buffer", "bytes", "limit", "frame", "size", "ack_min", "budget")


def describe_default(name: str, value: object) -> str:
    """A default as the pages write it: 1 MiB, 256 KiB, 10 s, 1,024, 100,000/s, 'block'."""
    if value is None or isinstance(value, bool) or not isinstance(value, int | float):
        return repr(value)
    if isinstance(value, int) and any(word in name for word in _BYTES) and value % 1024 == 0:
        for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if value % size == 0:
                return f"{value // size} {unit}"
    text = f"{value:,g}" if isinstance(value, float) else f"{value:,}"
    if name.endswith(("timeout", "interval")):
        return text + " s"
    if name.endswith("rate"):
        return text + "/s"
    return text


class DefaultsTable(Directive):
    """``polymux-defaults``: every SessionConfig field, its default, what it bounds."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        from polymux import SessionConfig

        docs = _field_docs(SessionConfig)
        table = nodes.table()
        group = nodes.tgroup(cols=3)
        table += group
        for width in (22, 16, 62):
            group += nodes.colspec(colwidth=width)
        head = nodes.thead()
        group += head
        row = nodes.row()
        for title in ("field", "default", "what it is"):
            row += nodes.entry("", nodes.paragraph(text=title))
        head += row
        body = nodes.tbody()
        group += body
        for field in fields(SessionConfig):
            default = field.default if field.default is not MISSING else None
            row = nodes.row()
            row += nodes.entry("", nodes.paragraph("", "", nodes.literal(text=field.name)))
            row += nodes.entry("", nodes.paragraph(text=describe_default(field.name, default)))
            row += nodes.entry("", nodes.paragraph(text=_plain(docs.get(field.name, ""))))
            body += row
        return [table]


def _table(head: list[str], rows: Iterable[list[str]], widths: list[int] | None = None) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=len(head))
    table += group
    for width in widths or [100 // len(head)] * len(head):
        group += nodes.colspec(colwidth=width)
    thead = nodes.thead()
    group += thead
    row = nodes.row()
    for title in head:
        row += nodes.entry("", nodes.paragraph(text=title))
    thead += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for i, cell in enumerate(cells):
            text = nodes.literal(text=cell) if i == 0 else nodes.Text(cell)
            row += nodes.entry("", nodes.paragraph("", "", text))
        body += row
    return table


def format_options_rows() -> list[list[str]]:
    """``polymux-format-options``: one row per typed option of the registered formats
    (option, formats, default, compatibility keyword, what it is)."""
    from polymux import formats

    by_class: dict[type, list[str]] = {}
    for fmt in formats.FORMATS:
        if fields(fmt.options):
            by_class.setdefault(type(fmt.options), []).append(fmt.name)
    rows = []
    for cls, names in by_class.items():
        docs = _field_docs(cls)
        keywords = {option: keyword for keyword, option in cls.legacy.items()}
        defaults = cls()
        rows.extend(
            [
                f"{cls.__name__}.{field.name}",
                ", ".join(names),
                describe_default(field.name, getattr(defaults, field.name)),
                keywords.get(field.name, ""),
                _plain(docs.get(field.name, "")),
            ]
            for field in fields(cls)
        )
    return rows


class FormatOptionsTable(Directive):
    """``polymux-format-options``: the typed options of every registered format."""

    has_content = False

    def run(self) -> list[nodes.Node]:
        head = ["option", "formats", "default", "compatibility keyword", "what it is"]
        return [_table(head, format_options_rows(), [22, 12, 12, 18, 36])]


FORMAT_TABLES = {
    "choosing": [
        "`protocol=`",
        "tested against",
        "flow control on the wire",
        "channel names",
        "half-close",
        "reset reason",
        "pings / keepalive",
        "limits of the format",
    ],
    "capabilities": [
        "`protocol=`",
        "names",
        "credit",
        "half-close",
        "reset text",
        "one-way streams",
        "pings",
    ],
    "index": ["`protocol=`", "page", "reference peer (interop-tested)", "flow control on the wire"],
}
"""The columns of each kind of ``polymux-formats`` table."""


def _word(flag: bool) -> str:
    return "yes" if flag else "no"


def _cell(word: str, detail: str) -> str:
    """A capability cell: the capability's word, then what the format's docs say of it."""
    if not detail:
        return word
    return word + detail if detail[0] in ",;" else f"{word}: {detail}"


def format_table(kind: str, docname: str = "index") -> list[str]:
    """The Markdown lines of the ``kind`` table of the registered formats, for the page
    ``docname`` (links to the format pages are relative to it)."""
    from polymux import formats

    head = FORMAT_TABLES[kind]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    here = posixpath.dirname(docname)
    for fmt in formats.FORMATS:
        caps, docs = fmt.caps, fmt.docs
        name = f"`{fmt.name}`"
        link = posixpath.relpath(docs.page, here or ".") if docs.page else ""
        credit = _cell(caps.credit or "none", docs.credit)
        if kind == "capabilities":
            cells = [
                name,
                _word(caps.names),
                caps.credit or "none",
                _word(caps.half_close),
                _word(caps.reset_message),
                _word(caps.one_way),
                _word(caps.ping),
            ]
        elif kind == "index":
            page = f"[{fmt.title}]({link})" if link else ""
            cells = [name, page, docs.tested_against, credit]
        else:
            cells = [
                f"[{name}]({link})" if link else name,
                docs.tested_against,
                credit,
                _cell(_word(caps.names), docs.names),
                _cell(_word(caps.half_close), docs.half_close),
                _cell(_word(caps.reset_message), docs.reset),
                _cell(_word(caps.ping), docs.pings),
                docs.limits,
            ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return lines


class FormatsTable(Directive):
    """``polymux-formats KIND``: a table of the registered formats (:data:`FORMAT_TABLES`),
    parsed as Markdown."""

    has_content = False
    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        kind = self.arguments[0]
        if kind not in FORMAT_TABLES:
            raise self.error(f"polymux-formats: unknown table {kind!r} (one of {', '.join(FORMAT_TABLES)})")
        docname = self.state.document.settings.env.docname
        container = nodes.container()
        self.state.nested_parse(StringList(format_table(kind, docname)), self.content_offset, container)
        return list(container.children)


# -- the generated tables of docs/defaults.md, as Markdown (readable in the repository) ------

GENERATED = re.compile(r"(<!-- generated: (\w[\w-]*)[^>]*-->\n)(.*?)(<!-- end of generated -->)", re.DOTALL)
"""A generated section of a page: its name, its Markdown, its end."""


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|")


def defaults_markdown() -> str:
    """Every SessionConfig field, its default and its docstring: a Markdown table."""
    from polymux import SessionConfig

    docs = _field_docs(SessionConfig)
    lines = ["| field | default | what it is |", "|---|---|---|"]
    for field in fields(SessionConfig):
        default = field.default if field.default is not MISSING else None
        lines.append(
            f"| `{field.name}` | {_md_cell(describe_default(field.name, default))} "
            f"| {_md_cell(_plain(docs.get(field.name, '')))} |"
        )
    return "\n".join(lines) + "\n"


def format_options_markdown() -> str:
    """Every registered format's typed options: a Markdown table."""
    lines = [
        "| option | formats | default | compatibility keyword | what it is |",
        "|---|---|---|---|---|",
    ]
    for option, names, default, keyword, doc in format_options_rows():
        key = f"`{keyword}`" if keyword else ""
        lines.append(f"| `{option}` | {_md_cell(names)} | {_md_cell(default)} | {key} | {_md_cell(doc)} |")
    return "\n".join(lines) + "\n"


MARKDOWN = {"defaults": defaults_markdown, "format-options": format_options_markdown}
"""The generated sections, by name."""


def regenerate(text: str) -> str:
    """``text`` (a page) with each generated section made again from the code."""
    return GENERATED.sub(lambda m: m.group(1) + MARKDOWN[m.group(2)]() + m.group(4), text)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("polymux-cli", CliReference)
    app.add_directive("polymux-defaults", DefaultsTable)
    app.add_directive("polymux-format-options", FormatOptionsTable)
    app.add_directive("polymux-formats", FormatsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    # python docs/_ext/polymux_docs.py: write docs/defaults.md's generated tables again.
    import pathlib

    page = pathlib.Path(__file__).resolve().parents[1] / "defaults.md"
    page.write_text(regenerate(page.read_text()))
