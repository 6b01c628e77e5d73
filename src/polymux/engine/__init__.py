"""Sans-I/O state machines, one per wire format, behind one interface (:class:`Engine`).

Each engine module also declares its formats' :class:`Capabilities` (which the engine
reads) and, where a format has settings of its own, its typed options
(:class:`FormatOptions`). Engines are made through the format registry,
:func:`polymux.formats.make_engine` / :meth:`polymux.formats.Format.make_engine`; this
package imports nothing above it.
"""

from __future__ import annotations

from polymux.engine.base import Engine
from polymux.engine.spec import Capabilities, FormatOptions, NoOptions


__all__ = ["Capabilities", "Engine", "FormatOptions", "NoOptions"]
