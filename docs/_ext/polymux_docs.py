"""Sphinx directives that generate pages from the code, so that they cannot drift from it.

``polymux-cli``: the reference of the ``polymux`` command, one section per subcommand,
built from the argparse parsers (usage, description, options with defaults, and the
exit-status table that ends every ``--help``).

``polymux-defaults``: every ``SessionConfig`` field with its default and its docstring,
read from the class.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import re
import textwrap
from dataclasses import MISSING, fields
from typing import Any

from docutils import nodes
from docutils.parsers.rst import Directive
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


def _field_docs(cls: type) -> dict[str, str]:
    """The docstring under each dataclass field (the string literal after it)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
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


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_directive("polymux-cli", CliReference)
    app.add_directive("polymux-defaults", DefaultsTable)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
