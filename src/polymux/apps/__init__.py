"""Applications built on polymux, behind the ``polymux`` commands (``webchat``, ``chat``,
``send``, ``receive``, ``demo``; :mod:`polymux.cli`) and ``examples/``:
:mod:`polymux.apps.filetransfer` (many files in parallel, one channel each, SHA-256,
resume, safe destination paths) and :mod:`polymux.apps.chat` (rooms as channels,
msgpack records, a bounded queue per member, numbered messages to catch up on);
:mod:`polymux.apps.chatclient` is the chat client that comes back after a lost
connection, :mod:`polymux.apps.webchat` the web page's server. :mod:`polymux.apps.records` is their
framing, :mod:`polymux.apps.common` the address and format helpers."""

from __future__ import annotations
