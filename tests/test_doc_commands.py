"""Every command line the README, the docs and benchmarks/README.md show is accepted by the
current command-line parsers: ``polymux ...`` (also as ``python -m polymux``,
``scripts/demo ...``, ``python -m polymux.pipeline`` and under ``spark-submit``) and the
benchmark suite's ``python -m benchmarks ...``.

Command lines are taken from code blocks (a ``$`` prompt is dropped, ``\\`` continues a
line, a ``#`` comment and what follows ``|`` or ``>`` are cut) and from inline code spans
that hold a command with arguments. Synopsis notation is expanded: ``[...]`` is tried
absent and present (each ``a | b`` alternative on its own), ``a|b`` in one word stands for
``a``, and a ``...`` that repeats the word before it is dropped. Placeholders (``FILE``,
``DIR``) are plain words to the parsers, so this checks options, not values that only make
sense at run time."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from polymux.cli import build_parser


ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").rglob("*.md")])

SUBCOMMANDS = (
    "webchat",
    "chat",
    "send",
    "receive",
    "demo",
    "serve",
    "connect",
    "bridge",
    "forward",
    "decode",
    "bench",
    "analyze",
)

# (regex on the start of a command line, the program it runs, words put before the rest)
PREFIXES: list[tuple[re.Pattern[str], str, list[str]]] = [
    (re.compile(r"^(?:\S*/)?python3? -m polymux\.pipeline\b"), "polymux", ["analyze"]),
    (re.compile(r"^spark-submit\b.*?\S*polymux/pipeline/__main__\.py\b"), "polymux", ["analyze"]),
    (re.compile(r"^(?:\S*/)?python3? -m polymux\b"), "polymux", []),
    (re.compile(r"^(?:\S*/)?polymux\b"), "polymux", []),
    (re.compile(r"^scripts/demo\b"), "polymux", ["demo"]),
    (re.compile(r"^scripts/webchat\b"), "polymux", ["webchat"]),
    (re.compile(r"^(?:\S*/)?python3? -m benchmarks(?=\s|$)"), "benchmarks", []),
]


def _prefix(line: str) -> tuple[str, list[str], str] | None:
    for regex, program, words in PREFIXES:
        if match := regex.match(line):
            return program, words, line[match.end() :]
    return None


def _code_lines(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, command)`` of each line of the fenced code blocks (shell-like ones
    and plain ones), continuations joined, prompts dropped."""
    fence: str | None = None
    pending = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("```"):
            if fence is None:
                language = stripped[3:].strip().lower()
                fence = language if language in ("", "sh", "bash", "shell", "console", "text") else "other"
            else:
                fence = None
            continue
        if fence is None or fence == "other":
            continue
        line = stripped.removeprefix("$ ")
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        yield start, pending + line
        pending = ""


def _spans(text: str) -> Iterator[tuple[int, str]]:
    """``(line number, command)`` of inline code spans outside code blocks."""
    in_block = False
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip().startswith("```"):
            in_block = not in_block
            continue
        if not in_block:
            for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", line):
                yield number, span


def _words(rest: str) -> list[str] | None:
    """The arguments after the command's prefix, cut at a comment, a pipe or a redirect;
    None if they do not parse as shell words."""
    try:
        lexer = shlex.shlex(rest, posix=True, punctuation_chars="|&;<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words = list(lexer)
    except ValueError:
        return None
    for i, word in enumerate(words):
        if word and set(word) <= set("|&;<>"):
            return words[:i]
    return words


def _variants(text: str) -> list[str]:
    """``text`` with each ``[...]`` group absent, or present (one alternative at a time)."""
    match = re.search(r"\[([^\[\]]*)\]", text)
    if match is None:
        return [text]
    inner = match.group(1)
    choices = [""] + [alt.strip() for alt in inner.split(" | ")]
    out: list[str] = []
    for choice in choices:
        out.extend(_variants(text[: match.start()] + choice + text[match.end() :]))
    return list(dict.fromkeys(out))


def _normalise(words: list[str]) -> list[str]:
    out: list[str] = []
    for word in words:
        if word == "..." and not (out and out[-1].startswith("-")):
            continue  # "repeat the word before": once is enough
        out.append(word)
    return out


def commands() -> Iterator[tuple[str, str, str, list[str]]]:
    """``(where, program, the text, argv)`` of every command line in the documents."""
    for path in DOCS:
        text = path.read_text()
        where = path.relative_to(ROOT)
        sources = [(n, line, True) for n, line in _code_lines(text)] + [
            (n, span, False) for n, span in _spans(text)
        ]
        for number, line, in_block in sources:
            found = _prefix(line.strip())
            if found is None:
                continue
            program, words, rest = found
            if program == "polymux" and not words:
                head = rest.split()[:1]
                # Output lines ("polymux demo: 16 files ..."), prose ("polymux (or python -m
                # polymux) has ...") and a bare name in a span ("`polymux serve`") are not
                # command lines.
                if not head or head[0] not in (*SUBCOMMANDS, "--help", "-h", "--version", "-V"):
                    continue
                if not in_block and len(rest.split()) < 2:
                    continue
            elif not in_block and not rest.strip() and program != "polymux":
                continue
            for variant in _variants(rest):
                # a|b in one word (no spaces): one of them, before "|" is taken for a pipe
                argv = _words(re.sub(r"(?<![\s|])\|[^\s|]+", "", variant))
                if argv is not None:
                    yield f"{where}:{number}", program, line.strip(), words + _normalise(argv)


def _parser(program: str) -> argparse.ArgumentParser:
    if program == "polymux":
        return build_parser()
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.suite import build_parser as suite_parser
    finally:
        sys.path.remove(str(ROOT))
    return suite_parser()


def rejected(program: str, argv: list[str]) -> str | None:
    """What the parser says about ``argv``, or None if it accepts it."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _parser(program).parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


ALL = list(commands())


def test_the_documents_show_command_lines() -> None:
    """The extraction finds what it should (so the test below cannot pass on nothing)."""
    where = {w.split(":")[0] for w, *_ in ALL}
    assert {"README.md", "benchmarks/README.md", "docs/cli.md", "docs/tracing.md", "docs/bridge.md"} <= where
    assert len(ALL) > 60
    programs = {(p, argv[0] if argv else "") for _w, p, _t, argv in ALL}
    assert {("polymux", c) for c in SUBCOMMANDS} <= programs
    assert any(p == "benchmarks" for p, _ in programs)


@pytest.mark.parametrize(("where", "program", "text", "argv"), ALL, ids=[f"{w}" for w, *_ in ALL])
def test_every_documented_command_line_is_accepted(
    where: str, program: str, text: str, argv: list[str]
) -> None:
    problem = rejected(program, argv)
    assert problem is None, f"{where}: {text!r} -> {argv}: {problem}"


@pytest.mark.parametrize(
    "line",
    [
        "polymux bench --no-go --formats yamux",  # benchmarks/README documented it; bench refused it
        "scripts/demo --size 8MiB",  # "invalid float value"
    ],
)
def test_lines_that_were_refused_are_accepted(line: str) -> None:
    found = _prefix(line)
    assert found is not None
    program, words, rest = found
    assert rejected(program, words + shlex.split(rest)) is None


def test_a_wrong_line_is_caught() -> None:
    assert rejected("polymux", ["bench", "--no-such-option"]) is not None
    assert rejected("polymux", ["connect", "--protocol", "yamux"]) is not None  # no address
