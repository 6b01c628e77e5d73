"""Shared ``main`` of the atheris harnesses: ``--format`` picks the wire format, every
other argument goes to libFuzzer (``-atheris_runs=N``, ``-max_len=N``, a corpus folder)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import atheris


def run(target: Callable[[str, bytes], object], formats: tuple[str, ...]) -> None:
    """Parse ``--format`` and fuzz ``target(format, data)`` with atheris."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--format", required=True, choices=formats)
    parser.add_argument(
        "--seed-corpus",
        action="store_true",
        help="also fuzz from fuzz/corpus/<format> (appended to libFuzzer's corpus folders)",
    )
    args, rest = parser.parse_known_args()
    fmt = args.format
    argv = [sys.argv[0], *rest]
    if args.seed_corpus:
        folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", fmt)
        argv.append(folder)

    def test_one(data: bytes) -> None:
        target(fmt, data)

    atheris.Setup(argv, test_one)
    atheris.Fuzz()
