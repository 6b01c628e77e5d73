"""The README's and the documentation's Python examples pass ``mypy --strict`` (issue 40
item 10): what users copy type-checks as written (``writer.transport.reset(...)`` did not:
asyncio types the transport as ``WriteTransport``; ``polymux.reset(writer, ...)`` does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from test_doc_examples import PYTHON


pytestmark = pytest.mark.timeout(600)


def test_every_python_example_passes_mypy_strict(tmp_path: Path) -> None:
    assert any(where.startswith("README.md") for where, _code, _needs in PYTHON)
    files = {}
    for i, (where, code, _needs) in enumerate(PYTHON):
        path = tmp_path / f"example_{i:02d}.py"
        path.write_text(code + "\n")
        files[path.name] = where
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--python-version",
            "3.11",
            *sorted(files),
        ],
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
        cwd=tmp_path,
    )
    out = proc.stdout
    for name, where in files.items():
        out = out.replace(name, where)
    assert proc.returncode == 0, out
