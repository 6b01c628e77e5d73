"""TCP port forwarding and a SOCKS5 proxy over one multiplexed connection, in any format
and on any transport polymux speaks: what ``ssh -L/-R/-D``, chisel and kcptun do, as a
library (``polymux forward`` is a thin command over it).

Two ends. The **far end** (:func:`start_far_end`) listens for sessions and connects
channels to targets; the **near end** (:func:`start_near_end`) connects to it, listens
locally and turns each local connection into a channel::

    from polymux.forward import start_far_end, start_near_end

    far = await start_far_end("yamux:tcp:0.0.0.0:4000", allow=["127.0.0.1:22"])
    near = await start_near_end("yamux:tcp:far.example:4000", local=["2222:127.0.0.1:22"], socks=["1080"])

* ``-L`` (``local=``): a local listener; each connection is a channel the far end
  connects to the target named (checked against its ``allow`` rules). ``-L PORT`` without
  a target opens a **bare** channel: no bytes of polymux's own, so that the far end
  may be any yamux or smux server that maps streams to one target (kcptun's server, the
  AWS Session Manager plugin's), and a far end with ``to=`` serves such clients written in
  Go.
* ``-R`` (``remote=``): the far end listens (if ``reverse=`` allows it); its connections
  come back as channels and the near end connects them.
* ``-D`` (``socks=``): a SOCKS5 server (RFC 1928, CONNECT, no authentication; the far end
  resolves names), whose replies say why a target failed.

Every byte is copied with the bridge's copy loop (:func:`polymux.bridging.copy_both`):
half-closes are carried both ways, and a slow reader holds back the writer at the other
end through the format's own credit, within each session's ``max_session_memory``. The
near end reconnects with a jittered, capped backoff (:class:`Backoff`). What a request
looks like on the wire: :mod:`polymux.forward.request`.
"""

from __future__ import annotations

from polymux.forward.common import ForwardStats
from polymux.forward.far import MAX_REVERSE, REVERSE_MODES, FarEnd, start_far_end
from polymux.forward.near import NearEnd, NotAForwarder, SessionFactory, start_near_end
from polymux.forward.request import MARK, MAX_LINE, ForwardError, Reply
from polymux.forward.spec import AllowList, AllowRule, Backoff, Forward, HostPort, parse_host_port


__all__ = [
    "MARK",
    "MAX_LINE",
    "MAX_REVERSE",
    "REVERSE_MODES",
    "AllowList",
    "AllowRule",
    "Backoff",
    "FarEnd",
    "Forward",
    "ForwardError",
    "ForwardStats",
    "HostPort",
    "NearEnd",
    "NotAForwarder",
    "Reply",
    "SessionFactory",
    "parse_host_port",
    "start_far_end",
    "start_near_end",
]
