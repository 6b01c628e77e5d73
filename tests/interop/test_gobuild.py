"""The Go peers' build (``gobuild.py``): a missing toolchain or library fails with how to
install it, and a peer is rebuilt exactly when its sources change."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from . import gobuild


pytestmark = pytest.mark.timeout(120)


def test_a_missing_go_toolchain_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gobuild.shutil, "which", lambda name: None)
    monkeypatch.setattr(gobuild.os.path, "exists", lambda path: False)
    with pytest.raises(gobuild.GoUnavailable) as info:
        gobuild.build("yamux_peer")
    message = str(info.value)
    assert "`go` is not on PATH" in message
    assert "scripts/setup --with-system" in message
    assert "apt-get install golang-go golang-github-hashicorp-yamux-dev" in message


def test_a_missing_go_library_names_its_debian_package(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(gobuild, "GOPATH", tmp_path)  # an empty GOPATH
    with pytest.raises(gobuild.GoUnavailable, match="golang-github-hashicorp-yamux-dev") as info:
        gobuild.build("yamux_peer")
    assert "github.com/hashicorp/yamux is missing" in str(info.value)


@pytest.mark.interop
def test_a_peer_is_rebuilt_only_when_its_sources_change(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    go_dir = tmp_path / "go"
    shutil.copytree(gobuild.GO_DIR, go_dir)
    monkeypatch.setattr(gobuild, "GO_DIR", go_dir)
    monkeypatch.setenv("POLYMUX_GO_CACHE", str(tmp_path / "cache"))
    first = gobuild.build("yamux_peer")
    assert first.parent == tmp_path / "cache" and first.stat().st_size > 0
    assert gobuild.build("yamux_peer") == first  # unchanged: the cached binary
    main = go_dir / "yamux_peer" / "main.go"
    main.write_text(main.read_text() + "\n// changed\n")
    second = gobuild.build("yamux_peer")
    assert second != first and second.exists()
