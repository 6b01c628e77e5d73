"""The documentation build fails on a broken link or cross-reference (scripts/docs runs
Sphinx with -W -n --keep-going, as CI does): a copy of docs/ with one dead link to a page
and one reference to a polymux name that does not exist must fail, naming both."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]


def test_a_broken_link_or_reference_fails_the_docs_build(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("_build"))
    # The includes (SECURITY.md, benchmarks/README.md and its plots) resolve from the copy.
    shutil.copy(ROOT / "SECURITY.md", tmp_path / "SECURITY.md")
    shutil.copytree(
        ROOT / "benchmarks", tmp_path / "benchmarks", ignore=shutil.ignore_patterns("*.py", "node")
    )
    page = docs / "getting-started.md"
    page.write_text(
        page.read_text() + "\nSee [the missing page](no-such-page.md) and {py:class}`polymux.NoSuchClass`.\n"
    )
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-E", "-W", "--keep-going", "-n", "-q", "-b", "html",
         str(docs), str(tmp_path / "html")],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "no-such-page" in proc.stderr and "polymux.NoSuchClass" in proc.stderr, proc.stderr
