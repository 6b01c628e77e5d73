"""Running polymux commands and examples as subprocesses, the way a user does: output is
collected line by line, waits are on lines (never on sleeps), everything is bounded in
time, and every process a test starts is ended by the test."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
PY = sys.executable


def _default_signals() -> None:
    """In the child before exec: SIGINT and SIGQUIT back to their default dispositions."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


class Proc:
    """A running subprocess with its stdout and stderr collected as lines."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
        self.out: list[str] = []
        self.err: list[str] = []
        self._changed = asyncio.Event()
        assert proc.stdout is not None and proc.stderr is not None
        self._readers = [
            asyncio.create_task(self._collect(proc.stdout, self.out)),
            asyncio.create_task(self._collect(proc.stderr, self.err)),
        ]

    async def _collect(self, stream: asyncio.StreamReader, lines: list[str]) -> None:
        while line := await stream.readline():
            lines.append(line.decode(errors="replace").rstrip("\n"))
            self._changed.set()
        self._changed.set()

    @property
    def stdout(self) -> str:
        return "\n".join(self.out)

    @property
    def stderr(self) -> str:
        return "\n".join(self.err)

    def describe(self) -> str:
        return f"--- {self.name} stdout:\n{self.stdout}\n--- {self.name} stderr:\n{self.stderr}"

    async def wait_for(self, predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:  # noqa: ASYNC109
        """Wait until ``predicate()`` holds (re-checked on each output line)."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    if self.proc.returncode is not None and all(r.done() for r in self._readers):
                        raise AssertionError(f"{self.name} exited ({self.proc.returncode}) before {what}")
                    self._changed.clear()
                    waiter = asyncio.ensure_future(self._changed.wait())
                    exited = asyncio.ensure_future(self.proc.wait())
                    await asyncio.wait({waiter, exited}, return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
                    exited.cancel()
        except TimeoutError:
            raise AssertionError(f"{self.name}: no {what} within {timeout} s\n{self.describe()}") from None

    async def line(self, pattern: str, *, stream: str = "out", timeout: float = 30.0) -> re.Match[str]:  # noqa: ASYNC109
        """The first line of ``stream`` matching ``pattern`` (waiting for it)."""
        regex = re.compile(pattern)
        lines = self.out if stream == "out" else self.err
        found: list[re.Match[str]] = []

        def check() -> bool:
            for line in lines:
                if m := regex.search(line):
                    found.append(m)
                    return True
            return False

        await self.wait_for(check, f"line matching {pattern!r} on std{stream}", timeout)
        return found[0]

    async def wait(self, timeout: float = 60.0) -> int:  # noqa: ASYNC109
        """Wait for the exit (and all output); return the exit status."""
        try:
            async with asyncio.timeout(timeout):
                code = await self.proc.wait()
                await asyncio.gather(*self._readers)
        except TimeoutError:
            raise AssertionError(f"{self.name} still running after {timeout} s\n{self.describe()}") from None
        return code

    def send_signal(self, sig: int) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(sig)

    async def stop(self) -> None:
        """End the process if it still runs (SIGKILL after 5 s of SIGTERM)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 5)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for reader in self._readers:
            reader.cancel()


class Procs:
    """Starts subprocesses and ends those still running at the end of the test."""

    def __init__(self) -> None:
        self.started: list[Proc] = []

    async def start(
        self,
        *args: str | Path,
        name: str | None = None,
        stdin: int | None = None,
        cwd: Path = ROOT,
        env: dict[str, str] | None = None,
    ) -> Proc:
        """Start ``args`` in ``cwd`` (the checkout unless told), with this process's
        environment or ``env``."""
        env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1", COLUMNS="200")
        proc = await asyncio.create_subprocess_exec(
            *(str(a) for a in args),
            stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            # As from a terminal: Ctrl-C (SIGINT) and SIGQUIT at their defaults. A suite run
            # in the background (`scripts/test &`, nohup, some CI runners) has them ignored,
            # and a child inherits that: the Ctrl-C tests then waited for ever.
            preexec_fn=_default_signals,
        )
        p = Proc(proc, name or " ".join(str(a) for a in args[:4]))
        self.started.append(p)
        return p

    async def polymux(self, *args: str | Path, name: str | None = None) -> Proc:
        """``python -m polymux ARGS``."""
        return await self.start(PY, "-m", "polymux", *args, name=name or f"polymux {args[0]}")

    async def example(self, script: str, *args: str | Path, name: str | None = None) -> Proc:
        """``python examples/SCRIPT ARGS``."""
        return await self.start(PY, EXAMPLES / script, *args, name=name or script)

    async def close(self) -> None:
        for p in self.started:
            await p.stop()


@pytest.fixture
async def procs() -> AsyncIterator[Procs]:
    """Start subprocesses with ``await procs.polymux(...)`` / ``procs.example(...)``."""
    p = Procs()
    try:
        yield p
    finally:
        await p.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A directory under /tmp with a short path (AF_UNIX paths are limited to 107 bytes)."""
    import shutil

    path = Path(tempfile.mkdtemp(prefix="pmx-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
