"""The static HTML report: ``index.html`` with PNG plots (matplotlib, on the driver, from the
small aggregated tables) and the head of every report table."""

from __future__ import annotations

import html
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any


if TYPE_CHECKING:
    import pandas as pd


__all__ = ["PLOTS_MISSING", "write_html"]

logger = logging.getLogger("polymux.pipeline")

PLOTS_MISSING = (
    "no plots: matplotlib is not installed (it comes with the spark extra: pip install 'polymux[spark]')"
)
"""What the report says (and logs) instead of its plots when matplotlib is missing."""

_TOP_SERIES = 12
_TOP_STALLS = 25
_ROWS = 200

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 0.85em; margin-bottom: 1em; }
th, td { border: 1px solid #ccc; padding: 0.2em 0.5em; text-align: right; }
th { background: #eee; }
td:first-child, th:first-child { text-align: left; }
.note { color: #666; font-size: 0.85em; }
"""


def _label(session: str, channel: str, direction: str, many_sessions: bool, name: object = None) -> str:
    where = f"{session} " if many_sessions else ""
    named = f" {name!r}" if isinstance(name, str) and name else ""
    return f"{where}ch {channel or '(session)'}{named} {direction}"


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, or None when matplotlib is missing."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_throughput(throughput: pd.DataFrame, target: Path) -> bool:
    plt = _pyplot()
    if plt is None or throughput.empty:
        return False
    keys = ["session", "channel", "direction"]
    totals = throughput.groupby(keys)["bytes"].sum().sort_values(ascending=False)
    top = list(totals.index[:_TOP_SERIES])
    starts = throughput.groupby("session")["second"].min()
    many = throughput["session"].nunique() > 1
    fig, ax = plt.subplots(figsize=(10, 5))
    for session, channel, direction in top:
        rows = throughput[
            (throughput["session"] == session)
            & (throughput["channel"] == channel)
            & (throughput["direction"] == direction)
        ].sort_values("second")
        ax.plot(
            rows["second"] - starts[session],
            rows["bytes"] / 1e6,
            marker="o",
            markersize=3,
            label=_label(session, channel, direction, many, rows["channel_name"].iloc[0]),
        )
    ax.set_xlabel("seconds since the session's first record")
    ax.set_ylabel("MB/s (data bytes per 1-second window)")
    ax.set_title(f"Throughput over time (top {len(top)} of {len(totals)} channel directions by bytes)")
    ax.legend(fontsize="small", loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return True


def _plot_stalls(stall_totals: pd.DataFrame, target: Path) -> bool:
    plt = _pyplot()
    if plt is None or stall_totals.empty:
        return False
    top = stall_totals.sort_values("stalled_s", ascending=False).head(_TOP_STALLS).iloc[::-1]
    many = stall_totals["session"].nunique() > 1
    labels = [
        f"{_label(r.session, r.channel, 'sender ' + r.sender, many, r.channel_name)} ({r.stalls}x)"
        for r in top.itertuples()
    ]
    fig, ax = plt.subplots(figsize=(10, max(2.5, 0.35 * len(top) + 1)))
    ax.barh(labels, top["stalled_s"])
    ax.set_xlabel("seconds at zero credit")
    ax.set_title("Flow-control stalls per channel and sender")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return True


def _table(frame: pd.DataFrame, sort: str | None = None) -> str:
    if frame.empty:
        return '<p class="note">(none)</p>'
    shown = frame.sort_values(sort, ascending=False) if sort else frame
    note = f'<p class="note">first {_ROWS} of {len(frame)} rows</p>' if len(frame) > _ROWS else ""
    return str(shown.head(_ROWS).to_html(index=False, border=0)) + note


def write_html(
    out: Path, tables: Mapping[str, pd.DataFrame], *, title: str = "polymux traffic report"
) -> Path:
    """Write ``out/index.html``, ``out/throughput.png`` and ``out/stalls.png`` from the
    collected report tables; return the HTML file's path. Without matplotlib the page has
    its tables and says why the plots are missing (:data:`PLOTS_MISSING`, also logged)."""
    out = Path(out)
    plots = _pyplot() is not None
    if not plots:
        logger.warning("polymux analyze: %s", PLOTS_MISSING)
    missing = f'<p class="note">({html.escape(PLOTS_MISSING)})</p>'
    has_tp = _plot_throughput(tables["throughput"], out / "throughput.png")
    has_st = _plot_stalls(tables["stall_totals"], out / "stalls.png")
    sessions = tables["sessions"]
    frames = int(sessions["frames"].sum()) if not sessions.empty else 0
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        (
            f"<p>{len(sessions)} sessions, {frames:,} frames, {len(tables['violations'])} violations, "
            f"{len(tables['stalls'])} stalls. Every table is also in this folder as CSV and Parquet.</p>"
        ),
        "<h2>Sessions</h2>",
        _table(sessions),
        "<h2>Throughput over time</h2>",
        '<img src="throughput.png" alt="throughput over time">'
        if has_tp
        else (missing if not plots else '<p class="note">(no data)</p>'),
        "<h2>Flow-control stalls</h2>",
        (
            '<p class="note">A stall lasts from the frame that brought a sender\'s credit on a channel to '
            "zero or below until the next frame that raised it above zero, or the end of the capture.</p>"
        ),
        '<img src="stalls.png" alt="stalls per channel">'
        if has_st
        else (missing if not plots else '<p class="note">(no stalls)</p>'),
        _table(tables["stall_totals"], "stalled_s"),
        "<h2>Protocol violations</h2>",
        _table(tables["violations"]),
        "<h2>Traffic per channel and direction</h2>",
        _table(tables["traffic"], "data_bytes"),
        "<h2>Channel lifetimes</h2>",
        _table(tables["lifetimes"]),
        "<h2>Ping RTTs</h2>",
        _table(tables["pings"]),
        "</body></html>",
    ]
    target = out / "index.html"
    target.write_text("\n".join(parts), encoding="utf-8")
    return target
