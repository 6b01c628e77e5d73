"""polymux as users get it (issue 40): the wheel and the sdist built from the checkout
(``python -m build``), their licence, metadata and README, ``twine check --strict``, one
version, and the wheel installed with ``[apps,websockets]`` into a fresh virtual
environment outside the checkout, where ``polymux webchat``, ``chat``, ``send`` /
``receive`` and ``--version`` run as the README shows. The build and the installation are
done once for the module (a minute or so: the build runs without isolation, pip fetches the
few dependencies from the machine's package index)."""

from __future__ import annotations

import asyncio
import email
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

import polymux
from polymux._version import __version__
from polymux.apps.common import EXIT_OK
from polymux.cli import main

from .procs import ROOT, Procs


pytestmark = pytest.mark.timeout(900)

COPYRIGHT = "Copyright (c) 2026 the polymux authors"
URL = "https://github.com/polymux/polymux"
_SKIP = shutil.ignore_patterns(
    ".git", ".venv", ".venv-*", "node_modules", "__pycache__", "*.egg-info", "build", "dist", "_build",
    "tmp", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis", "go-partial.tsv",
)  # fmt: skip


@dataclass(frozen=True)
class Dists:
    wheel: Path
    sdist: Path


def _run(*args: str | Path, cwd: Path | None = None, timeout: float = 600) -> str:
    proc = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
    )
    assert proc.returncode == 0, (
        f"{' '.join(map(str, args))}: {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    )
    return proc.stdout


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> Dists:
    """The sdist and the wheel of (a copy of) this checkout."""
    work = tmp_path_factory.mktemp("dists")
    source = work / "polymux"
    shutil.copytree(ROOT, source, ignore=_SKIP)
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", work / "dist", source)
    (wheel,) = (work / "dist").glob("polymux-*.whl")
    (sdist,) = (work / "dist").glob("polymux-*.tar.gz")
    return Dists(wheel, sdist)


@pytest.fixture(scope="module")
def installed(dists: Dists, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtual environment, outside the checkout, with ``<wheel>[apps,websockets]``."""
    venv = tmp_path_factory.mktemp("venv") / "env"
    _run(sys.executable, "-m", "venv", venv)
    _run(venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check",
         f"{dists.wheel}[apps,websockets]")  # fmt: skip
    return venv


def _metadata(dists: Dists) -> email.message.Message:
    with zipfile.ZipFile(dists.wheel) as wheel:
        return email.message_from_bytes(wheel.read(f"polymux-{__version__}.dist-info/METADATA"))


def test_the_wheel_and_the_sdist_carry_the_licence(dists: Dists) -> None:
    with zipfile.ZipFile(dists.wheel) as wheel:
        licence = wheel.read(f"polymux-{__version__}.dist-info/licenses/LICENSE").decode()
        names = wheel.namelist()
    assert COPYRIGHT in licence and "MIT License" in licence
    assert {f"polymux/apps/web/{f}" for f in ("index.html", "chat.js", "style.css")} <= set(names)
    with tarfile.open(dists.sdist) as sdist:
        member = sdist.extractfile(f"polymux-{__version__}/LICENSE")
        assert member is not None and COPYRIGHT in member.read().decode()
    assert (ROOT / "LICENSE").read_text() == licence


def test_the_metadata_has_links_classifiers_and_authors(dists: Dists) -> None:
    meta = _metadata(dists)
    assert meta["License-Expression"] == "MIT" and meta["License-File"] == "LICENSE"
    assert meta["Author"] == "the polymux authors" and "yamux" in meta["Keywords"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Documentation", "Source", "Changelog", "Issues"} <= set(urls)
    assert all(u.startswith(URL) for u in urls.values())
    classifiers = set(meta.get_all("Classifier"))
    assert {
        "Typing :: Typed",
        "Framework :: AsyncIO",
        "Topic :: System :: Networking",
        "Programming Language :: Python :: 3.11",
        "Programming Language :: Python :: 3.12",
        "Programming Language :: Python :: 3.13",
    } <= classifiers


def test_the_readme_serves_the_index_and_a_checkout(dists: Dists) -> None:
    """The long description's first screen: install from the index, a short example, the
    commands, then a checkout's scripts; every link absolute (relative ones break on the
    index)."""
    description = _metadata(dists).get_payload()
    assert isinstance(description, str)
    first = description[: description.index("\n## ")]
    order = [
        first.index(s) for s in ("\npip install polymux", "```python", "\npolymux webchat", "\nscripts/demo")
    ]
    assert order == sorted(order), order
    links = re.findall(r"\]\(([^)]+)\)", description)
    assert links and all(link.startswith(("https://", "#")) for link in links), links


def test_twine_check_strict(dists: Dists) -> None:
    out = _run(sys.executable, "-m", "twine", "check", "--strict", dists.wheel, dists.sdist)
    assert out.count("PASSED") == 2, out


def test_the_sdist_has_the_docs_changelog_and_examples_and_no_tests(dists: Dists) -> None:
    """No tests: they need the checkout's tools (Node and Go peers, scripts), so a test
    folder in the sdist could only fail collection."""
    with tarfile.open(dists.sdist) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    assert {"docs/changelog.md", "docs/conf.py", "docs/index.md", "SECURITY.md", "examples/echo.py"} <= names
    assert "benchmarks/README.md" in names  # the docs include it
    assert not any(n.startswith("tests/") or n == "tests" for n in names)


VERSION_LINE = re.compile(rf"polymux {re.escape(__version__)}, data plane: (compiled|pure Python) .*")
"""What ``polymux --version`` prints: the version, and the data plane's path in use
(tests/test_speedups.py checks the path itself)."""


def test_one_version(dists: Dists, capsys: pytest.CaptureFixture[str]) -> None:
    """Written once (polymux/_version.py): the metadata, ``polymux.__version__`` and
    ``polymux --version`` / ``-V`` say the same."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _metadata(dists)["Version"] == __version__ == polymux.__version__
    for flag in ("--version", "-V"):
        with pytest.raises(SystemExit) as exit_info:
            main([flag])
        assert exit_info.value.code == 0
        assert VERSION_LINE.fullmatch(capsys.readouterr().out.rstrip("\n"))


def test_the_wheel_is_a_platform_wheel_with_the_compiled_data_plane(dists: Dists) -> None:
    """Built where a compiler is (this machine: scripts/setup installs gcc), the wheel holds
    an extension for every module of the data plane beside its .py twin, and says so in its
    tag (not py3-none-any); the sdist holds no binary (its generated C, as msgpack's, lets a
    machine with a compiler but no Cython build it)."""
    from polymux._speedups import COMPILED_MODULES

    assert not dists.wheel.name.endswith("-py3-none-any.whl"), dists.wheel.name
    with zipfile.ZipFile(dists.wheel) as wheel:
        names = set(wheel.namelist())
    for module in COMPILED_MODULES:
        base = module.replace(".", "/")
        assert f"{base}.py" in names, module
        assert any(n.startswith(f"{base}.") and n.endswith(".so") for n in names), module
    with tarfile.open(dists.sdist) as sdist:
        assert not [n for n in sdist.getnames() if n.endswith((".so", ".pyd"))]


async def _get(url: str) -> bytes:
    def get() -> bytes:
        with urllib.request.urlopen(url, timeout=10) as answer:
            body: bytes = answer.read()
            return body

    return await asyncio.to_thread(get)


async def test_the_installed_wheel_runs_the_apps(installed: Path, procs: Procs, tmp_path: Path) -> None:
    """``pip install '<wheel>[apps,websockets]'`` in a fresh venv, run outside the checkout
    as the README shows: --version, webchat (its page comes from the installed package),
    chat against it, send and receive."""
    bin_dir = installed / "bin"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", XDG_DATA_HOME=str(tmp_path / "data"))
    home = tmp_path / "user"
    home.mkdir()

    where = await procs.start(
        bin_dir / "python", "-c", "import polymux; print(polymux.__file__)", cwd=home, env=env, name="where"
    )
    assert await where.wait() == EXIT_OK and where.stdout.startswith(str(installed)), where.describe()
    version = await procs.start(bin_dir / "polymux", "--version", cwd=home, env=env, name="version")
    assert await version.wait() == EXIT_OK and VERSION_LINE.fullmatch(version.stdout), version.describe()
    assert "compiled (Cython)" in version.stdout, version.describe()  # the wheel's extension runs

    webchat = await procs.start(
        bin_dir / "polymux", "webchat", "--tcp", "127.0.0.1:0", "--web", "127.0.0.1:0",
        cwd=home, env=env, name="webchat",
    )  # fmt: skip
    page = await webchat.line(r"web page on (http://127\.0\.0\.1:\d+/) \(files in (.*)\)$")
    assert page.group(2) == str(tmp_path / "data" / "polymux" / "webchat-files")
    assert b"<script" in await _get(page.group(1))
    hint = await webchat.line(r"terminal clients join with: polymux chat (.*)$")
    words = hint.group(1).split()
    assert words[-4:] == ["--nick", "NAME", "--room", "lobby"]
    chat = await procs.start(
        bin_dir / "polymux", "chat", *words[:-3], "ada", "--say", "hi from the wheel",
        cwd=home, env=env, name="chat",
    )  # fmt: skip
    assert await chat.wait() == EXIT_OK, chat.describe()
    assert "[#lobby] ada: hi from the wheel" in chat.stdout, chat.describe()
    webchat.send_signal(signal.SIGTERM)
    assert await webchat.wait() == EXIT_OK, webchat.describe()

    (home / "photos").mkdir()
    (home / "photos" / "a.jpg").write_bytes(os.urandom(300_000))
    (home / "notes.txt").write_text("polymux\n")
    receive = await procs.start(
        bin_dir / "polymux", "receive", "--protocol", "yamux", "--tcp", "127.0.0.1:0", "--dest", "inbox/",
        cwd=home, env=env, name="receive",
    )  # fmt: skip
    address = (await receive.line(r" on tcp:(\S+), into ")).group(1)
    send = await procs.start(
        bin_dir / "polymux", "send", "--protocol", "yamux", "--tcp", address, "photos/", "notes.txt",
        cwd=home, env=env, name="send",
    )  # fmt: skip
    assert await send.wait() == EXIT_OK, send.describe()
    assert "2/2 files verified" in send.stdout, send.describe()
    assert (home / "inbox" / "a.jpg").read_bytes() == (home / "photos" / "a.jpg").read_bytes()
    assert (home / "inbox" / "notes.txt").read_text() == "polymux\n"
    receive.send_signal(signal.SIGINT)
    assert await receive.wait() == EXIT_OK, receive.describe()
