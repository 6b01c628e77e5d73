"""What a format declares about itself, once, for its engine and for everything above it.

:class:`Capabilities` says what a format can carry and how its channels behave; each
engine module declares its formats' capabilities and the engine reads them
(``Engine.has_ping``, ``Engine.one_way`` ... come from them), while the format registry
(:mod:`polymux.formats`), the bridge and the documentation tables read the same object.

:class:`FormatOptions` is the base of a format's typed options (``StreamuxOptions``,
``SmuxOptions``, ``YamuxOptions``): settings that mean something to one format only.
Older releases had them as :class:`~polymux.SessionConfig` fields
(``streamux_quick_init`` ...); those keyword names still work: a field set on the
configuration (not ``None``) is mapped onto the typed option (:meth:`FormatOptions.merged`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Self


if TYPE_CHECKING:
    from polymux.config import SessionConfig


__all__ = ["Capabilities", "FormatOptions", "NoOptions"]


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a format can carry and how its channels behave: declared once per format (in
    its engine module), read by its engine and by the registry, the bridge and the docs."""

    names: bool
    """The opener names a channel on the wire."""
    credit: str | None
    """Flow control on the wire: ``"bytes"`` (a window per channel), ``"messages"`` (a
    credit of messages), or ``None`` (none: bounded buffers and the slow-reader policy)."""
    ping: bool
    """The format has pings (keepalive, RTT)."""
    half_close: bool
    """A channel can end one direction and keep reading the other."""
    reset_message: bool
    """A reset carries the reason as text."""
    one_way: bool = False
    """Channels carry data from their opener to their acceptor only (omnistreams)."""
    handshake: bool = False
    """The session starts with a handshake (channels wait for it)."""
    conversation_option: str | None = None
    """The keyword a server sets so that one channel carries a conversation (Streamux's
    ``streamux_early_responses``; ``None``: channels always can)."""
    message_transport: bool = False
    """The format also runs over a message transport (WebSocket), one message per frame."""
    acceptance: bool = True
    """An opened channel waits for the peer's acceptance before it is usable; ``False``:
    usable at once (mplex, yamux ...)."""
    open_acknowledged: bool = False
    """The peer acknowledges each open that is usable at once (yamux's ACK): the session
    bounds the opens awaiting it (``max_unacked_opens``, ``stream_open_timeout``)."""
    ping_answered: bool = True
    """The peer answers a ping; ``False`` where nothing answers the keepalive frame (smux's
    NOP): the next whole frame from the peer acknowledges it instead."""
    controls: bool = False
    """The format carries session-level control messages (omnistreams)."""


@dataclass(frozen=True, slots=True)
class FormatOptions:
    """Base of a format's typed options: a frozen dataclass whose fields validate on
    construction (``ValueError``).

    ``legacy`` maps the :class:`~polymux.SessionConfig` keyword that older releases used
    for an option onto the option's name; such a keyword, when set on a configuration,
    still applies (:meth:`merged`).
    """

    legacy: ClassVar[Mapping[str, str]] = {}
    """``{SessionConfig field: option name}`` for the keywords kept for compatibility."""

    def merged(self, config: SessionConfig | None) -> Self:
        """These options with the legacy fields that ``config`` sets (not ``None``) applied.

        Raises:
            ValueError: a legacy field's value is not valid for its option (the message
                names the keyword as it was given).
        """
        if config is None or not self.legacy:
            return self
        changes: dict[str, Any] = {}
        given: list[str] = []
        for field, option in self.legacy.items():
            value = getattr(config, field)
            if value is not None:
                changes[option] = value
                given.append(field)
        if not changes:
            return self
        try:
            return dataclasses.replace(self, **changes)
        except ValueError as exc:
            raise ValueError(f"{exc} (given as SessionConfig {', '.join(given)})") from None


@dataclass(frozen=True, slots=True)
class NoOptions(FormatOptions):
    """The options of a format that has none of its own."""
