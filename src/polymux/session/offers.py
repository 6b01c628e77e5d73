"""Who may open channels: the peer's offers, and the limits on ours.

* The peer's offers: a token bucket charged for every open as it is read
  (``inbound_channel_rate``: a peer opening faster is abusive, refused opens and ones
  already reset, Rapid Reset, included), then the refusals: the session is closing,
  ``max_channels``, ``max_inbound_channels`` (a channel whose handler still runs counts),
  ``max_name_bytes``, the offer filter, and the accept backlog (``accept_backlog``, without a
  handler).
* Ours: ``max_channels``, ``max_outbound_channels``, and on formats whose opens the peer
  acknowledges (yamux) ``max_unacked_opens``: past it, :class:`NoRoomToOpen` until a
  :class:`~polymux.session.events.RoomToOpen` event.
"""

from __future__ import annotations

from collections.abc import Callable

from polymux.config import SessionConfig
from polymux.exceptions import LimitExceeded, ProtocolError
from polymux.session import events as ce
from polymux.session.channels import ChannelTable


__all__ = ["NoRoomToOpen", "OfferFilter", "Offers"]

OfferFilter = Callable[[str], bool]
"""``offer_filter(name) -> bool``: accept (True) or refuse (False) the peer's offer."""


class NoRoomToOpen(LimitExceeded):
    """``max_unacked_opens`` of our opens await acknowledgement: wait for
    :class:`~polymux.session.events.RoomToOpen` and try again."""


class Offers:
    """The open rate, the refusals and our unacknowledged opens (see the module docstring)."""

    __slots__ = ("config", "format", "has_handler", "offer_filter", "pending", "stamp", "table", "tokens")

    def __init__(
        self,
        fmt: str,
        config: SessionConfig,
        table: ChannelTable,
        now: float,
        offer_filter: OfferFilter | None,
        has_handler: bool,
    ) -> None:
        self.format = fmt
        self.config = config
        self.table = table
        self.offer_filter = offer_filter
        self.has_handler = has_handler
        self.tokens = max(1.0, config.inbound_channel_rate)
        self.stamp = now
        self.pending: set[int] = set()
        """Our opens the peer has not acknowledged yet."""

    # -- the peer's offers -------------------------------------------------------------------

    def charge(self, now: float) -> ProtocolError | None:
        """Charge one open to the bucket; the error that ends the session if it is empty."""
        rate = self.config.inbound_channel_rate
        self.tokens = min(max(1.0, rate), self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens < 1:
            return ProtocolError(self.format, f"the peer opens channels faster than {rate:g} per second")
        self.tokens -= 1
        return None

    def refuse(self, name: str, closing: bool) -> bool:
        """Whether to refuse the peer's offer of a channel named ``name``."""
        config = self.config
        table = self.table
        return (
            closing
            or len(table.channels) >= config.max_channels
            or max(table.inbound, table.handlers) >= config.max_inbound_channels
            or len(name) > config.max_name_bytes  # characters: a fast first check
            or len(name.encode("utf-8", "surrogatepass")) > config.max_name_bytes
            or (self.offer_filter is not None and not self.offer_filter(name))
            or (not self.has_handler and table.untaken >= config.accept_backlog)
        )

    # -- ours --------------------------------------------------------------------------------

    def check_open(self, acknowledged: bool) -> None:
        """Raise unless we may open one more channel now (``acknowledged``: the peer
        acknowledges opens)."""
        config = self.config
        channels = len(self.table.channels)
        if channels >= config.max_channels:
            raise LimitExceeded(f"{self.format}: max_channels={config.max_channels} channels are open")
        if channels - self.table.inbound >= config.max_outbound_channels:
            raise LimitExceeded(
                f"{self.format}: max_outbound_channels={config.max_outbound_channels} channels are open"
            )
        if acknowledged and len(self.pending) >= config.max_unacked_opens:
            raise NoRoomToOpen(
                f"{self.format}: max_unacked_opens={config.max_unacked_opens} opened channels await the "
                "peer's acknowledgement"
            )

    @property
    def room(self) -> int:
        """How many more opens may await acknowledgement now."""
        return self.config.max_unacked_opens - len(self.pending)

    def settle(self, handle: int, timed_out: bool = False) -> ce.RoomToOpen | None:
        """Our open of ``handle`` was acknowledged, or the channel ended: room for a waiting
        open (``timed_out``: the first waiting open fails instead, since a peer that does not
        accept would reset it too). None if it was not waiting."""
        if handle not in self.pending:
            return None
        self.pending.discard(handle)
        if not timed_out:
            return ce.RoomToOpen()
        config = self.config
        return ce.RoomToOpen(
            LimitExceeded(
                f"{self.format}: no room to open a channel: max_unacked_opens="
                f"{config.max_unacked_opens} opened channels await the peer's acknowledgement, "
                f"and one was not acknowledged within stream_open_timeout="
                f"{config.stream_open_timeout:g} s"
            )
        )
