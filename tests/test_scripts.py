"""The set-up of the README's commands: ``scripts/demo`` (and ``scripts/webchat``) install
only what they need, ``scripts/test`` / ``scripts/setup`` the development set, each once.

The scripts run for real in a copy of the checkout's scripts and pyproject.toml, with a
stand-in ``.venv/bin/python`` that records its arguments instead of installing: what would
be installed, and when, is what is checked (no network, a fraction of a second)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/../calls"
"""


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of scripts/ and pyproject.toml, with a recording stand-in for .venv's python."""
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(FAKE_PYTHON)
    python.chmod(0o755)
    return tmp_path


def run(checkout: Path, *args: str) -> list[str]:
    """Run a script of the copy; the stand-in python's calls it made."""
    calls = checkout / ".venv" / "calls"
    calls.unlink(missing_ok=True)
    proc = subprocess.run(
        [str(checkout / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHON": "python3"},
    )
    assert proc.returncode == 0, proc.stderr
    return calls.read_text().splitlines() if calls.exists() else []


def started(calls: list[str]) -> list[str]:
    """The calls but the data plane's build check (a script on stdin: ``-``, quick; it
    compiles only what is older than its source)."""
    return [c for c in calls if c != "-"]


def installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install -q -e ")]


def test_the_demo_installs_only_the_apps_extra(checkout: Path) -> None:
    calls = run(checkout, "scripts/demo", "--files", "2")
    assert installs(calls) == ["-m pip install -q -e .[apps]"]
    assert calls[-1] == "-m polymux demo --files 2"
    # Once installed, the next run starts at once.
    assert started(run(checkout, "scripts/demo")) == ["-m polymux demo"]


def test_the_web_chat_installs_apps_and_websockets(checkout: Path) -> None:
    calls = run(checkout, "scripts/webchat", "--web", "127.0.0.1:8080")
    assert installs(calls) == ["-m pip install -q -e .[apps,websockets]"]
    assert calls[-1] == "-m polymux webchat --web 127.0.0.1:8080"  # the packaged command


def test_the_test_set_up_installs_the_development_set_which_serves_the_demo_too(checkout: Path) -> None:
    assert installs(run(checkout, "scripts/demo")) == ["-m pip install -q -e .[apps]"]
    # scripts/test's set-up (without node and Debian packages, which this test leaves out).
    assert installs(run(checkout, "scripts/setup")) == ["-m pip install -q -e .[dev]"]
    assert installs(run(checkout, "scripts/setup")) == []
    assert started(run(checkout, "scripts/demo")) == ["-m polymux demo"]  # dev holds apps: nothing to install


def test_a_changed_pyproject_reinstalls(checkout: Path) -> None:
    run(checkout, "scripts/demo")
    stamp = checkout / ".venv" / ".polymux-installed-apps"
    os.utime(stamp, (1, 1))  # older than pyproject.toml
    assert installs(run(checkout, "scripts/demo")) == ["-m pip install -q -e .[apps]"]


def test_scripts_test_sets_up_the_development_set() -> None:
    text = (ROOT / "scripts" / "test").read_text()
    assert "scripts/setup --with-node --with-system\n" in text  # no --extras: dev
