"""Build the Go reference peers (``tests/interop/go/<name>/``) against the Debian packages of
the Go libraries, once per source change, into a cache directory.

``GOPATH=/usr/share/gocode GO111MODULE=off go build``: Debian's ``golang-go`` and
``golang-github-*-dev`` packages (``scripts/debian-packages``) hold everything, so the build
is offline. The binary's name carries a hash of its sources, of the shared ``peer`` package,
of the library sources it builds against and of ``go version``: a change to any of them
builds a new one, and nothing else does. Used by the interop tests and by the benchmark
suite's Go rows.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


GO_DIR = Path(__file__).resolve().parent / "go"
GOPATH = Path("/usr/share/gocode")

LIBRARIES = {
    "yamux_peer": ("github.com/hashicorp/yamux", "golang-github-hashicorp-yamux-dev"),
    "smux_peer": ("github.com/xtaci/smux", "golang-github-xtaci-smux-dev"),
}
"""Each peer's Go library and the Debian package that provides it."""

INSTALL_HINT = (
    "install the Go toolchain and the Go libraries from Debian: scripts/setup --with-system "
    "(or apt-get install golang-go golang-github-hashicorp-yamux-dev golang-github-xtaci-smux-dev)"
)


class GoUnavailable(RuntimeError):
    """The Go toolchain or a Go library is missing, or a peer does not build."""


def cache_dir() -> Path:
    """Where built peers go: ``$POLYMUX_GO_CACHE``, else ``$XDG_CACHE_HOME/polymux/go-peers``
    (``~/.cache/...``)."""
    env = os.environ.get("POLYMUX_GO_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "polymux" / "go-peers"


def _go() -> str:
    go = shutil.which("go") or ("/usr/lib/go/bin/go" if os.path.exists("/usr/lib/go/bin/go") else None)
    if go is None:
        raise GoUnavailable(
            f"the Go reference peers need the Go toolchain (`go` is not on PATH): {INSTALL_HINT}"
        )
    return go


def _digest(name: str, go: str) -> str:
    library, package = LIBRARIES[name]
    lib_dir = GOPATH / "src" / library
    if not lib_dir.is_dir():
        raise GoUnavailable(
            f"{library} is missing under {GOPATH}/src (Debian package {package}): {INSTALL_HINT}"
        )
    h = hashlib.sha256()
    version = subprocess.run([go, "version"], check=True, capture_output=True, text=True, timeout=60)
    h.update(version.stdout.encode())
    for folder in (GO_DIR / name, GO_DIR / "peer", lib_dir):
        for path in sorted(folder.glob("*.go")):
            h.update(path.name.encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def build(name: str) -> Path:
    """The built peer ``tests/interop/go/<name>`` (built now if its sources changed).

    Raises :class:`GoUnavailable` with how to install what is missing, or with the
    compiler's output.
    """
    if name not in LIBRARIES or not (GO_DIR / name).is_dir():
        known = ", ".join(n for n in LIBRARIES if (GO_DIR / n).is_dir())
        raise ValueError(f"no Go peer {name!r} under {GO_DIR}; there are: {known}")
    go = _go()
    out_dir = cache_dir()
    binary = out_dir / f"{name}-{_digest(name, go)}"
    if binary.exists():
        os.utime(binary)  # in use: _prune keeps it
        return binary
    out_dir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "GOPATH": str(GOPATH),
        "GO111MODULE": "off",
        "GOFLAGS": "",
        "GOCACHE": str(out_dir / "go-build"),
        "CGO_ENABLED": "0",
    }
    # Build under a temporary name, then rename: parallel test runs never see half a binary.
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-", dir=out_dir)
    os.close(fd)
    try:
        result = subprocess.run(
            [go, "build", "-o", tmp, "."],
            check=False,
            cwd=GO_DIR / name,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if result.returncode != 0:
            raise GoUnavailable(f"go build of {GO_DIR / name} failed:\n{result.stdout}{result.stderr}")
        os.replace(tmp, binary)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    _prune(out_dir, name, binary)
    return binary


STALE_DAYS = 7


def _prune(out_dir: Path, name: str, keep: Path) -> None:
    """Remove other builds of ``name`` unused for STALE_DAYS days (other checkouts sharing
    the cache may still use recent ones)."""
    cutoff = time.time() - STALE_DAYS * 86400
    for old in out_dir.glob(f"{name}-*"):
        if old != keep and old.is_file() and old.stat().st_mtime < cutoff:
            old.unlink(missing_ok=True)
