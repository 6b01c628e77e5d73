"""polymux bench runs the benchmark suite of a polymux checkout (python -m benchmarks,
quick mode unless --full). The suite lives in benchmarks/ at the repository root, not in
the installed package: it is looked up from the current directory upwards, then next to
this package's source tree (an editable install), and run with the same Python. Its exit
status is the suite's; no checkout found exits 1.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from polymux.apps.common import EXIT_FAILED, EXIT_STATUS, size_type


__all__ = ["REPOSITORY", "find_suite", "register", "run", "suite_command"]

REPOSITORY = "https://github.com/polymux/polymux"
"""The repository to clone for the suite (the project's links in ``pyproject.toml``)."""


def find_suite(start: Path | None = None) -> Path | None:
    """The repository root holding ``benchmarks/__main__.py``, or None.

    Looks in ``start`` (default: the current directory) and its parents, then in the
    parents of this file (a source checkout installed in editable mode)."""
    here = (start or Path.cwd()).resolve()
    candidates = [here, *here.parents, *Path(__file__).resolve().parents]
    for root in candidates:
        if (root / "benchmarks" / "__main__.py").is_file() and (root / "benchmarks" / "suite.py").is_file():
            return root
    return None


_VALUE_OPTIONS = {
    "--formats": "comma-separated formats (default all)",
    "--scenarios": "comma-separated: bulk,messages,rr,churn,scale,slow,tracing (default all)",
    "--loops": "comma-separated: asyncio,uvloop (default both)",
    "--transports": "comma-separated: tcp,unix (default both)",
    "--out": "output directory (default benchmarks/results/ of the checkout)",
    "--repeat": "repeats per figure",
    "--bulk-size": "bytes per bulk measurement, e.g. 64MiB (at least 1MiB)",
    "--bulk-channels": "bulk channel counts, e.g. 1,16,256",
    "--messages": "messages per small-message measurement",
    "--seconds": "seconds per rr / churn measurement",
    "--scale-counts": "idle channel counts, e.g. 10000,100000",
    "--slow-size": "bytes sent into the slow reader, e.g. 8MiB (at least 1MiB)",
}
_SIZES = ("--bulk-size", "--slow-size")  # checked here with the one size parser, passed in bytes
_FLAGS = {
    "--no-node": "no Node reference rows",
    "--no-go": "no Go reference rows",
    "--no-pin": "do not pin the sending and receiving processes to CPUs of their own",
    "--quiet": "no progress lines",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``polymux bench``."""
    bench = sub.add_parser(
        "bench",
        help="run the benchmark suite of this checkout (quick mode by default)",
        description=__doc__,
        epilog=EXIT_STATUS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = bench.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="the quick sizes (the default)")
    mode.add_argument("--full", action="store_true", help="the full sizes (takes long)")
    for name, text in _VALUE_OPTIONS.items():
        if name in _SIZES:
            bench.add_argument(name, type=size_type(1 << 20), metavar="SIZE", help=text)
        else:
            bench.add_argument(name, help=text)
    for name, text in _FLAGS.items():
        names = (name, "-q") if name == "--quiet" else (name,)
        bench.add_argument(*names, action="store_true", help=text)
    bench.set_defaults(func=run, parser=bench)


def suite_command(args: argparse.Namespace) -> list[str]:
    """The ``python -m benchmarks`` command line for parsed ``polymux bench`` arguments."""
    cmd = [sys.executable, "-m", "benchmarks", "--full" if args.full else "--quick"]
    for name in _VALUE_OPTIONS:
        value = getattr(args, name[2:].replace("-", "_"), None)
        if value is not None:
            cmd += [name, str(value)]
    for name in _FLAGS:
        if getattr(args, name[2:].replace("-", "_"), False):
            cmd.append(name)
    return cmd


def run(args: argparse.Namespace) -> int:
    """Run ``python -m benchmarks`` from the checkout; its exit status."""
    root = find_suite()
    if root is None:
        print(
            "polymux bench: cannot find the benchmark suite (benchmarks/__main__.py): run it from a "
            f"polymux source checkout (git clone {REPOSITORY}; cd polymux; polymux bench)",
            file=sys.stderr,
        )
        return EXIT_FAILED
    if args.out is not None:
        args.out = str(Path(args.out).resolve())  # the suite runs in the checkout
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH", "")) if p)
    return subprocess.call(suite_command(args), cwd=root, env=env)
