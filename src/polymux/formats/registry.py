"""The format registry: every wire format polymux speaks, one :class:`Format` object each.

A name (``protocol="yamux"``) is looked up once, where it enters polymux (``connect``,
``start_server``, the bridge, the CLI, capture, decode, detection, the pipeline:
:func:`resolve`); below that, layers receive the :class:`Format` object and ask it for
what they need (an engine, a frame-record walk, a signature, capabilities), never the name
again. Every list of formats (the CLI's choices, detection, the docs tables, the
benchmarks) is the registry's, live: :func:`register` adds a format for everything at once.

The built-in formats are declared by name (:func:`declare`) and their modules loaded when
one of them is first asked for (:func:`get`, or a walk over :data:`FORMATS`), as engines
and codecs always were: ``import polymux`` and the CLI's ``--help``, which need only the
names, load no engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar, overload

from polymux.config import COMPATIBILITY_FIELDS, SessionConfig
from polymux.engine.base import Engine
from polymux.formats.format import Format


__all__ = [
    "FORMATS",
    "PROTOCOLS",
    "declare",
    "get",
    "make_engine",
    "register",
    "resolve",
    "unregister",
]

# -- the registry --------------------------------------------------------------------------

_BY_NAME: dict[str, Format | Callable[[], Sequence[Format]]] = {}
"""Registered formats by name, in order; a declared format not loaded yet is the function
that loads its module's formats."""

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


def _all() -> tuple[Format, ...]:
    if len(_formats) != len(_names):
        for name in _names:
            get(name)
    return _formats


FORMATS: Sequence[Format] = _Live(_all)
"""Every registered format, in the order the CLI and the docs list them (a live view:
formats registered later are in it)."""

PROTOCOLS: Sequence[str] = _Live(lambda: _names)
"""The names of the registered formats (``protocol=``), in :data:`FORMATS` order (a
live view)."""


def _update() -> None:
    global _formats, _names
    _formats = tuple(f for f in _BY_NAME.values() if isinstance(f, Format))
    _names = tuple(_BY_NAME)


def declare(names: Sequence[str], load: Callable[[], Sequence[Format]]) -> None:
    """Register the formats ``names`` without loading them: ``load()`` returns them (their
    module's formats, which must have those names) when one is first asked for. How the
    built-in formats are registered; a plugin with heavy modules may do the same.

    Raises:
        ValueError: a format of one of those names is registered already.
    """
    for name in names:
        if name in _BY_NAME:
            raise ValueError(f"a format named {name!r} is registered already")
    for name in names:
        _BY_NAME[name] = load
    _update()


def _load(name: str, load: Callable[[], Sequence[Format]]) -> Format:
    """Load the declared format ``name`` (and the others its module declares)."""
    for fmt in load():
        if _BY_NAME.get(fmt.name) is load:
            _BY_NAME[fmt.name] = fmt
    _update()
    found = _BY_NAME[name]
    if isinstance(found, Format):
        return found
    raise LookupError(f"the module declared for format {name!r} does not define it")


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
        found = _BY_NAME[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown protocol {name!r}; polymux speaks: {', '.join(_names)}") from None
    return found if isinstance(found, Format) else _load(name, found)


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
    _refuse_what_it_ignores(fmt, config)
    if fmt.legacy is not None:
        fmt = fmt.legacy(fmt, config)
    options = fmt.options.merged(config)
    return fmt if options is fmt.options else dataclasses.replace(fmt, options=options)


def _refuse_what_it_ignores(fmt: Format, config: SessionConfig) -> None:
    """A setting ``fmt`` would ignore is refused, naming whose it is: another format's own
    option set through its compatibility keyword (``max_receive_window`` on mplex). (What
    a format does with the general fields is its :attr:`Format.legacy` hook's.)"""
    own = fmt.options.legacy
    stray = [k for k in COMPATIBILITY_FIELDS if k not in own and getattr(config, k) is not None]
    if not stray:
        return  # the usual case: no other format is loaded to find out
    for other in FORMATS:
        option = other.options.legacy.get(stray[0])
        if option is not None:
            raise ValueError(
                f"{stray[0]} is an option of {other.name} ({type(other.options).__name__}.{option}): "
                f"{fmt.name} has no such setting; leave it out for {fmt.name}"
            )


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
