"""Why there is no session with a peer: :func:`diagnose` (what it sent, how sure we are of
what it speaks, and what to try). It lives in :mod:`polymux.session.diagnosis`, where the
sessions' own errors use it; this is where the commands and older code found it."""

from __future__ import annotations

from polymux.session.diagnosis import NAME_CONFIDENCE, Diagnosis, diagnose


__all__ = ["NAME_CONFIDENCE", "Diagnosis", "diagnose"]
