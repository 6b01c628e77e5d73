"""Optional dependencies and the extras that bring them: one place that says which extra
to install when a module is missing, for the library (:class:`~polymux.exceptions.MissingExtra`,
raised where the module is first needed) and for the commands (:func:`missing_extra`: the one line they
print instead of a traceback, exit status 1)."""

from __future__ import annotations

import importlib
from types import ModuleType

from polymux.exceptions import MissingExtra


__all__ = ["EXTRAS", "MissingExtra", "missing_extra", "require"]

EXTRAS: dict[str, str] = {
    "pyarrow": "capture",
    "dpkt": "pcap",
    "websockets": "websockets",
    "anyio": "anyio",
    "uvloop": "uvloop",
    "rich": "apps",
    "pyspark": "spark",
    "py4j": "spark",
    "pandas": "spark",
    "matplotlib": "spark",
}
"""The third-party modules polymux can use, and the extra that installs each
(``pip install 'polymux[EXTRA]'``)."""


def require(module: str, needed_by: str) -> ModuleType:
    """Import ``module`` (a key of :data:`EXTRAS`, or one of its submodules), or raise
    :class:`MissingExtra` saying that ``needed_by`` needs it and which extra to install."""
    top = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name is not None and exc.name.split(".")[0] == top:
            raise MissingExtra(top, EXTRAS[top], needed_by) from None
        raise  # the module is there but one of its own dependencies is not


def missing_extra(exc: BaseException) -> str | None:
    """For a command: the one line to print when ``exc`` is a module of an extra that is
    not installed (what needs it and the ``pip install`` line), else None."""
    if isinstance(exc, MissingExtra):
        return str(exc)
    if isinstance(exc, ModuleNotFoundError) and exc.name is not None:
        top = exc.name.split(".")[0]
        if top in EXTRAS:
            return f"this needs {top}, which is not installed: pip install 'polymux[{EXTRAS[top]}]'"
    return None
