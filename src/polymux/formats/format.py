"""A wire format as one object: :class:`Format` (what the registry,
:mod:`polymux.formats.registry`, holds; each format's module declares its own)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from polymux.config import SessionConfig, suggest
from polymux.engine.spec import Capabilities, FormatOptions, NoOptions
from polymux.formats.signature import Signature
from polymux.formats.walk import Walk, WalkHost


if TYPE_CHECKING:
    from polymux.engine.base import Engine


__all__ = ["EngineFactory", "Format", "FormatDocs"]

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
    """Applies what a configuration's general fields mean to this format, or refuses what it
    cannot honour (``ValueError``): a compatibility keyword that names another format
    (``omnistreams_numbering="legacy"``: ``omnistreams-legacy``), yamux's
    ``receive_window`` (its streams' windows are its own)."""
    versions: tuple[str, ...] = ()
    """The other versions of this protocol polymux speaks (``smux``: ``smux-v2``): a peer
    configured with one of them may close the connection without a word, so the diagnosis
    of a peer that did (:func:`polymux.tracing.diagnose`) names them."""

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
            raise TypeError(
                f"{self.name} has no option {', '.join(unknown)}{suggest(unknown[0], known)} (its options: {have})"
            )
        return dataclasses.replace(self, options=dataclasses.replace(self.options, **options))
