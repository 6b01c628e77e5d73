"""The format registry: every wire format polymux speaks, one :class:`Format` object each.

A name (``protocol="yamux"``) is looked up once, where it enters polymux (``connect``,
``start_server``, the bridge, the CLI, capture, decode, detection, the pipeline:
:func:`resolve`); below that, layers receive the :class:`Format` object and ask it for
what they need (an engine, a frame-record walk, a signature, capabilities), never the name
again. Every list of formats (the CLI's choices, detection, the docs tables, the
benchmarks) is the registry's, live: :func:`register` adds a format for everything at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar, overload

from polymux.config import SessionConfig
from polymux.engine.spec import Capabilities, FormatOptions, NoOptions
from polymux.formats.signature import Signature
from polymux.formats.walk import Walk, WalkHost


if TYPE_CHECKING:
    from polymux.engine.base import Engine


__all__ = [
    "FORMATS",
    "PROTOCOLS",
    "EngineFactory",
    "Format",
    "FormatDocs",
    "get",
    "make_engine",
    "register",
    "resolve",
    "unregister",
]

EngineFactory = Callable[["Format", SessionConfig, bool, bool], "Engine"]
"""``factory(format, config, is_client, message_mode)``: a new engine of ``format`` (whose
typed options it reads) for one session."""


@dataclass(frozen=True, slots=True)
class FormatDocs:
    """What the documentation's format tables say of a format beyond its
    :class:`~polymux.engine.spec.Capabilities` (Markdown; each capability cell is the
    capability's word, then the text given here after a colon)."""

    page: str = ""
    """Its page, relative to ``docs/`` (``formats/yamux.md``); empty: none."""
    tested_against: str = ""
    """The reference implementations it is tested against."""
    credit: str = ""
    """About its flow control."""
    names: str = ""
    """About channel names."""
    half_close: str = ""
    """About half-close."""
    reset: str = ""
    """About reset reasons."""
    pings: str = ""
    """About pings and keepalive."""
    limits: str = ""
    """The limits of the format."""


_NO_OPTIONS = NoOptions()
_NO_DOCS = FormatDocs()


@dataclass(frozen=True, slots=True)
class Format:
    """One wire format: its name, what it can do, and how to run, walk and detect it.

    Get one from the registry (:func:`get`, :func:`resolve`); :meth:`configure` gives a
    copy with other typed options (``get("streamux").configure(early_responses=True)``),
    usable wherever ``protocol=`` takes a name.
    """

    name: str
    """The ``protocol=`` name."""
    title: str
    """What the docs call it."""
    family: str
    """Formats of one family share a wire (mplex and multiplex differ in conventions only):
    detection names the family's first member when the bytes cannot tell."""
    caps: Capabilities
    """What it can carry (declared once, in its engine module, and read by its engine)."""
    engine: EngineFactory
    """Builds its engine (:meth:`make_engine`)."""
    walk: Callable[[WalkHost], Walk]
    """``walk(decoder)``: a new frame-record walk of a connection (bytes in, records out),
    driven by :class:`~polymux.tracing.FrameDecoder`."""
    signature: Signature | None = None
    """How its first bytes are told apart (``None``: a family member whose first format's
    signature names it too)."""
    options: FormatOptions = _NO_OPTIONS
    """Its typed options (:class:`~polymux.engine.spec.NoOptions` for a format without)."""
    docs: FormatDocs = _NO_DOCS
    """What the docs tables say of it."""
    legacy: Callable[[Format, SessionConfig], Format] | None = None
    """Maps a configuration's compatibility keyword that names another format onto that
    format (``omnistreams_numbering="legacy"``: ``omnistreams-legacy``)."""

    def make_engine(
        self, config: SessionConfig | None = None, *, is_client: bool = True, message_mode: bool = False
    ) -> Engine:
        """A new engine of this format, with this format's typed options.

        Raises:
            ValueError: ``message_mode`` for a format that does not run over messages.
        """
        if message_mode and not self.caps.message_transport:
            raise ValueError(f"{self.name} does not run over a message transport")
        return self.engine(self, config or SessionConfig(), is_client, message_mode)

    def configure(self, **options: Any) -> Format:
        """This format with ``options`` (names of its typed options) changed.

        Raises:
            TypeError: an option this format does not have.
            ValueError: a value the option does not take.
        """
        known = {f.name for f in dataclasses.fields(self.options)}
        unknown = sorted(set(options) - known)
        if unknown:
            have = ", ".join(sorted(known)) or "none"
            raise TypeError(f"{self.name} has no option {', '.join(unknown)} (its options: {have})")
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **options))


# -- the registry --------------------------------------------------------------------------

_BY_NAME: dict[str, Format] = {}

T = TypeVar("T")


class _Live(Sequence[T]):
    """A read-only view of the registry that follows :func:`register`."""

    __slots__ = ("_items",)

    def __init__(self, items: Callable[[], tuple[T, ...]]) -> None:
        self._items = items

    @overload
    def __getitem__(self, index: int) -> T: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[T, ...]: ...

    def __getitem__(self, index: int | slice) -> T | tuple[T, ...]:
        return self._items()[index]

    def __len__(self) -> int:
        return len(self._items())

    def __iter__(self) -> Iterator[T]:
        return iter(self._items())

    def __contains__(self, value: object) -> bool:
        return value in self._items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _Live):
            return self._items() == other._items()
        return self._items() == other

    def __hash__(self) -> int:
        return hash(self._items())

    def __repr__(self) -> str:
        return repr(self._items())


_formats: tuple[Format, ...] = ()
_names: tuple[str, ...] = ()

FORMATS: Sequence[Format] = _Live(lambda: _formats)
"""Every registered format, in the order the CLI and the docs list them (a live view:
formats registered later are in it)."""

PROTOCOLS: Sequence[str] = _Live(lambda: _names)
"""The names of the registered formats (``protocol=``), in :data:`FORMATS` order (a
live view)."""


def _update() -> None:
    global _formats, _names
    _formats = tuple(_BY_NAME.values())
    _names = tuple(_BY_NAME)


def register(fmt: Format) -> Format:
    """Add ``fmt`` to the registry: from now on every layer knows it (``protocol=`` names,
    the CLI's choices, capture, decode, detection, the bridge, the pipeline, the
    benchmarks, the docs tables). Returns ``fmt``.

    Raises:
        ValueError: a format of that name is registered already.
    """
    if fmt.name in _BY_NAME:
        raise ValueError(f"a format named {fmt.name!r} is registered already")
    _BY_NAME[fmt.name] = fmt
    _update()
    return fmt


def unregister(name: str) -> Format:
    """Remove the format ``name`` from the registry (a plugin that goes away, a test);
    returns it.

    Raises:
        ValueError: no format of that name is registered.
    """
    fmt = get(name)
    del _BY_NAME[name]
    _update()
    return fmt


def get(name: str) -> Format:
    """The registered format named ``name``.

    Raises:
        ValueError: naming the formats there are.
    """
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown protocol {name!r}; polymux speaks: {', '.join(_names)}") from None


def resolve(protocol: str | Format, config: SessionConfig | None = None) -> Format:
    """The format ``protocol`` names (or ``protocol`` itself, a :class:`Format`), with the
    compatibility keywords ``config`` sets applied: a format's options set through their
    older :class:`~polymux.SessionConfig` keywords (``streamux_quick_init`` ...) are
    mapped onto its typed options (they win over the format's own), and
    ``omnistreams_numbering="legacy"`` makes ``omnistreams`` the ``omnistreams-legacy``
    format. What the API's entry points call, once.

    Raises:
        ValueError: an unknown name (naming the formats there are), or a compatibility
            keyword's value that its option does not take.
    """
    fmt = protocol if isinstance(protocol, Format) else get(protocol)
    if config is None:
        return fmt
    if fmt.legacy is not None:
        fmt = fmt.legacy(fmt, config)
    options = fmt.options.merged(config)
    return fmt if options is fmt.options else dataclasses.replace(fmt, options=options)


def make_engine(
    protocol: str | Format,
    config: SessionConfig | None = None,
    *,
    is_client: bool = True,
    message_mode: bool = False,
) -> Engine:
    """A new engine for ``protocol`` (:func:`resolve` with ``config``, then
    :meth:`Format.make_engine`).

    ``is_client`` tells which end of the connection this is, for formats whose id
    allocation depends on it; ``message_mode``: over a transport that keeps message
    boundaries (WebSocket), for formats that can.
    """
    return resolve(protocol, config).make_engine(config, is_client=is_client, message_mode=message_mode)
