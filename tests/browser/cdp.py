"""A headless Chromium driven over the Chrome DevTools Protocol, on one WebSocket.

Just what the browser tests need: launch (Debian's ``chromium``, no download), pages,
``Runtime.evaluate`` (awaiting promises, results by value), waiting for a condition in the
page (a ``MutationObserver``, no polling), file inputs, drag and drop of files, downloads,
the page's uncaught errors, screen sizes (a phone's, with touch) and screenshots. Protocol: https://chromedevtools.github.io/devtools-protocol/
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import itertools
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import websockets
from websockets.asyncio.client import ClientConnection


FLAGS = [
    "--headless",
    "--no-sandbox",  # we run as root in CI containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # small /dev/shm in containers
]

CANDIDATES = ("chromium", "chromium-headless-shell", "chromium-browser", "google-chrome", "chrome")

INSTALL_HINT = (
    "the browser tests need Chromium and found none (looked for $POLYMUX_CHROMIUM, then "
    f"{', '.join(CANDIDATES)} on PATH). Install it with `scripts/setup --with-system` (Debian: "
    "`apt-get install chromium`, listed in scripts/debian-packages), or point POLYMUX_CHROMIUM "
    "at a Chromium or Chrome binary."
)


class BrowserMissing(RuntimeError):
    """No usable Chromium was found (the message says how to install one)."""


class PageError(RuntimeError):
    """JavaScript in the page threw, or the page reported an uncaught error."""


def find_chromium(env: dict[str, str] | None = None) -> str:
    """The Chromium to run: ``$POLYMUX_CHROMIUM``, else the first of ``CANDIDATES`` on PATH;
    raises :class:`BrowserMissing` saying how to install one."""
    env = dict(os.environ) if env is None else env
    chosen = env.get("POLYMUX_CHROMIUM")
    if chosen:
        if os.path.isfile(chosen) and os.access(chosen, os.X_OK):
            return chosen
        raise BrowserMissing(f"POLYMUX_CHROMIUM={chosen!r} is not an executable file. {INSTALL_HINT}")
    for name in CANDIDATES:
        found = shutil.which(name, path=env.get("PATH", ""))
        if found:
            return found
    raise BrowserMissing(INSTALL_HINT)


class Chromium:
    """One headless Chromium process and its DevTools connection."""

    def __init__(self, proc: asyncio.subprocess.Process, ws: ClientConnection, log: collections.deque[str]):
        self.proc = proc
        self.ws = ws
        self.log = log
        """The browser's last stderr lines (for failure messages)."""
        self._ids = itertools.count(1)
        self._calls: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._listeners: list[Callable[[str, dict[str, Any], str | None], None]] = []
        self._reader = asyncio.ensure_future(self._read())
        self._drainer: asyncio.Task[None] | None = None

    @classmethod
    async def launch(
        cls,
        executable: str,
        user_data_dir: Path,
        *,
        timeout: float = 30,  # noqa: ASYNC109
        flags: tuple[str, ...] = (),
    ) -> Chromium:
        """Start ``executable`` headless with a fresh profile in ``user_data_dir`` and connect
        (``timeout``: for the browser to listen; ``flags``: more command-line flags)."""
        proc = await asyncio.create_subprocess_exec(
            executable,
            *FLAGS,
            *flags,
            f"--user-data-dir={user_data_dir}",
            "--remote-debugging-port=0",
            "--remote-debugging-address=127.0.0.1",
            "about:blank",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        log: collections.deque[str] = collections.deque(maxlen=40)
        assert proc.stderr is not None
        try:
            async with asyncio.timeout(timeout):
                while True:
                    line = await proc.stderr.readline()
                    if not line:
                        raise RuntimeError(
                            f"{executable} exited (status {await proc.wait()}) before DevTools listened:\n"
                            + "\n".join(log)
                        )
                    text = line.decode(errors="replace").rstrip()
                    log.append(text)
                    match = re.search(r"DevTools listening on (ws://\S+)", text)
                    if match:
                        break
            ws = await websockets.connect(match.group(1), max_size=None, ping_interval=None)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        browser = cls(proc, ws, log)
        browser._drainer = asyncio.ensure_future(browser._drain(proc.stderr))
        return browser

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        # Keep reading stderr: a full pipe would block the browser.
        while line := await stream.readline():
            self.log.append(line.decode(errors="replace").rstrip())

    async def _read(self) -> None:
        error: BaseException = ConnectionError("the DevTools connection closed")
        try:
            async for raw in self.ws:
                message = json.loads(raw)
                if "id" in message:
                    future = self._calls.pop(message["id"], None)
                    if future is not None and not future.done():
                        future.set_result(message)
                    continue
                for listener in list(self._listeners):
                    listener(message["method"], message.get("params", {}), message.get("sessionId"))
        except Exception as exc:  # noqa: BLE001 - every pending call fails with it
            error = exc
        for future in self._calls.values():
            if not future.done():
                future.set_exception(error)

    async def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None
    ) -> Any:
        """Call ``method``; return its result or raise ``PageError`` with the protocol's error."""
        call_id = next(self._ids)
        message: dict[str, Any] = {"id": call_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._calls[call_id] = future
        await self.ws.send(json.dumps(message))
        answer = await future
        if "error" in answer:
            raise PageError(f"{method}: {answer['error'].get('message')} {answer['error'].get('data', '')}")
        return answer.get("result", {})

    def listen(self, listener: Callable[[str, dict[str, Any], str | None], None]) -> None:
        """Call ``listener(method, params, session)`` for every event."""
        self._listeners.append(listener)

    async def new_page(self) -> Page:
        """A new tab, attached, with the Page and Runtime domains on."""
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        page = Page(self, attached["sessionId"])
        await page.send("Page.enable")
        await page.send("Runtime.enable")
        return page

    async def allow_downloads(self, directory: Path) -> None:
        """Save downloads in ``directory`` under their own names, with progress events."""
        await self.send(
            "Browser.setDownloadBehavior",
            {"behavior": "allow", "downloadPath": str(directory), "eventsEnabled": True},
        )

    async def close(self) -> None:
        """Close the browser (kill it if it does not go) and the connection."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(5):
                await self.send("Browser.close")
        with contextlib.suppress(Exception):
            await self.ws.close()
        try:
            async with asyncio.timeout(10):
                await self.proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()
        for task in (self._reader, self._drainer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task


class Page:
    """One tab."""

    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser = browser
        self.session = session
        self.errors: list[str] = []
        """Uncaught exceptions and console errors of the page."""
        self._loaded: asyncio.Event = asyncio.Event()
        browser.listen(self._on_event)

    def _on_event(self, method: str, params: dict[str, Any], session: str | None) -> None:
        if session != self.session:
            return
        if method == "Page.loadEventFired":
            self._loaded.set()
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.errors.append(details.get("exception", {}).get("description") or details.get("text", "?"))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(
                " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            )

    async def send(self, method: str, params: dict[str, Any] | None = None) -> Any:
        """A DevTools call on this tab."""
        return await self.browser.send(method, params, self.session)

    async def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self._loaded.clear()
        result = await self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise PageError(f"cannot open {url}: {result['errorText']}")
        await self._loaded.wait()

    async def fake_response(self, url_pattern: str, body: bytes, content_type: str = "text/html") -> None:
        """Answer this tab's requests matching ``url_pattern`` (``*`` wildcards) with ``body``
        instead of the network (the Fetch domain); other requests go out as usual. A page
        "served" by a site the test does not run (another origin, say)."""
        tasks: set[asyncio.Task[Any]] = set()

        def on_event(method: str, params: dict[str, Any], session: str | None) -> None:
            if session != self.session or method != "Fetch.requestPaused":
                return
            answer = {
                "requestId": params["requestId"],
                "responseCode": 200,
                "responseHeaders": [{"name": "Content-Type", "value": content_type}],
                "body": base64.b64encode(body).decode(),
            }
            task = asyncio.ensure_future(self.send("Fetch.fulfillRequest", answer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        self.browser.listen(on_event)
        await self.send(
            "Fetch.enable", {"patterns": [{"urlPattern": url_pattern, "requestStage": "Request"}]}
        )

    async def reload(self) -> None:
        """Reload the page, as a person does (F5), and wait for the load event."""
        self._loaded.clear()
        await self.send("Page.reload")
        await self._loaded.wait()

    async def set_screen(self, width: int, height: int, *, phone: bool = False) -> None:
        """Show the page at ``width`` x ``height`` CSS pixels; ``phone``: as a phone does
        (the page's viewport meta applies, touch events, no mouse hover)."""
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": phone},
        )
        await self.send("Emulation.setTouchEmulationEnabled", {"enabled": phone, "maxTouchPoints": 5})

    async def screenshot(self, path: Path, *, full_page: bool = False) -> Path:
        """Save what the screen shows as a PNG at ``path`` (``full_page``: the whole
        document, scrolled parts included); returns ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            metrics = await self.send("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
            params["captureBeyondViewport"] = True
        shot = await self.send("Page.captureScreenshot", params)
        data = base64.b64decode(shot["data"])

        def save() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)

        await asyncio.to_thread(save)
        return path

    async def evaluate(self, expression: str) -> Any:
        """Run ``expression`` in the page (awaiting it if it is a promise, as a user gesture)
        and return its value; raise ``PageError`` with the page's exception."""
        result = await self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True, "userGesture": True},
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise PageError(f"{text}\n  in: {expression[:300]}")
        return result["result"].get("value")

    async def wait_for(self, predicate: str, timeout: float = 30) -> Any:  # noqa: ASYNC109
        """Wait until the JavaScript expression ``predicate`` is truthy (checked at every
        DOM change, without polling) and return its value; after ``timeout`` seconds raise
        ``AssertionError`` naming the predicate and the page's errors."""
        try:
            async with asyncio.timeout(timeout):
                return await self._wait_for(predicate)
        except TimeoutError:
            raise AssertionError(
                f"the page did not show {predicate.strip()!r} within {timeout} s; page errors: {self.errors}"
            ) from None

    async def _wait_for(self, predicate: str) -> Any:
        return await self.evaluate(
            """new Promise(resolve => {
                const check = () => {
                    let value
                    try { value = (PREDICATE) } catch (e) { value = undefined }
                    if (value) { observer.disconnect(); resolve(value) }
                }
                const observer = new MutationObserver(check)
                observer.observe(document, {subtree: true, childList: true, attributes: true, characterData: true})
                check()
            })""".replace("PREDICATE", predicate)
        )

    async def node(self, selector: str) -> str:
        """The remote object id of the first element matching ``selector``."""
        result = await self.send(
            "Runtime.evaluate", {"expression": f"document.querySelector({json.dumps(selector)})"}
        )
        object_id = result["result"].get("objectId")
        if object_id is None:
            raise PageError(f"no element matches {selector!r}")
        return str(object_id)

    async def set_files(self, selector: str, paths: list[Path]) -> None:
        """Choose ``paths`` in the file input ``selector`` (its change event fires)."""
        await self.send(
            "DOM.setFileInputFiles", {"files": [str(p) for p in paths], "objectId": await self.node(selector)}
        )

    async def center(self, selector: str) -> tuple[float, float]:
        """The middle of the first element matching ``selector``, in CSS pixels."""
        box = await self.evaluate(
            f"(e => {{ e.scrollIntoView({{block: 'nearest'}}); const r = e.getBoundingClientRect();"
            f" return [r.x + r.width / 2, r.y + r.height / 2] }})(document.querySelector({json.dumps(selector)}))"
        )
        return float(box[0]), float(box[1])

    async def tap(self, selector: str) -> None:
        """Touch the element ``selector`` with a finger (a phone's tap: touch events, then
        the click the browser makes of them)."""
        x, y = await self.center(selector)
        for kind, points in (("touchStart", [{"x": x, "y": y}]), ("touchEnd", [])):
            await self.send("Input.dispatchTouchEvent", {"type": kind, "touchPoints": points})

    async def click(self, selector: str) -> None:
        """Click the element ``selector`` with the mouse (moves there first: hover)."""
        x, y = await self.center(selector)
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1}
            )

    async def hover(self, selector: str) -> None:
        """Move the mouse over the element ``selector``."""
        x, y = await self.center(selector)
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})

    async def type_text(self, text: str) -> None:
        """Type ``text`` into the focused element (as an input method does)."""
        await self.send("Input.insertText", {"text": text})

    async def press_enter(self, *, shift: bool = False) -> None:
        """Press Enter (with Shift) on the keyboard, into the focused element."""
        event = {"key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "modifiers": 8 if shift else 0}
        await self.send("Input.dispatchKeyEvent", {"type": "keyDown", "text": "\r", **event})
        await self.send("Input.dispatchKeyEvent", {"type": "keyUp", **event})

    async def file_chooser(self) -> asyncio.Future[int]:
        """From now on, a file dialog the page opens is caught (not shown): the future
        gets the file input's backend node id (pass it to :meth:`choose`)."""
        opened: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_event(method: str, params: dict[str, Any], session: str | None) -> None:
            if session == self.session and method == "Page.fileChooserOpened" and not opened.done():
                opened.set_result(int(params["backendNodeId"]))

        self.browser.listen(on_event)
        await self.send("Page.setInterceptFileChooserDialog", {"enabled": True})
        return opened

    async def choose(self, node: int, paths: list[Path]) -> None:
        """Choose ``paths`` in the file dialog :meth:`file_chooser` caught."""
        await self.send("DOM.setFileInputFiles", {"files": [str(p) for p in paths], "backendNodeId": node})

    async def drop_files(self, selector: str, paths: list[Path]) -> None:
        """Drag ``paths`` onto the element ``selector`` and drop them, as a user would."""
        box = await self.evaluate(
            f"(r => [r.x + r.width / 2, r.y + r.height / 2])"
            f"(document.querySelector({json.dumps(selector)}).getBoundingClientRect())"
        )
        data = {"items": [], "files": [str(p) for p in paths], "dragOperationsMask": 1}
        for kind in ("dragEnter", "dragOver", "drop"):
            await self.send("Input.dispatchDragEvent", {"type": kind, "x": box[0], "y": box[1], "data": data})
