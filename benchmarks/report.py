"""Outputs of the suite: results.json (every row, every repeat), results.md (tables with
ratios to the baseline of the same run, and where the issue's targets stand) and PNG plots
(throughput against channel count and against message size)."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from benchmarks.common import RAW_PROTOCOL, RAW_STREAMS, Row


NODE_SUFFIX = ">node"
GO_SUFFIX = ">go"
"""Rows of a format's Go library, Go to Go (``<format>>go``)."""

TARGETS: list[tuple[str, str, list[str], float, str]] = [
    # (scenario, case, formats, minimum ratio, wording)
    ("bulk", "1 ch", ["yamux", "mplex"], 0.85, "bulk, 1 channel >= 0.85 x raw streams"),
    ("bulk", "1 ch", ["mstream-v1", "mstream-v2", "mstream-v3"], 0.7, "bulk, 1 channel >= 0.7 x raw streams"),
    ("bulk", "256 ch", [], 0.8, "bulk, 256 channels >= 0.8 x raw streams"),
    ("messages", "64 B x 1 ch", [], 0.5, "64-byte messages >= 0.5 x raw length-prefixed"),
]


def ratios(rows: list[Row]) -> dict[int, float | None]:
    """``id(row) -> median / baseline median`` for rows with a baseline in the same run."""
    by_key: dict[tuple[Any, ...], dict[str, Row]] = defaultdict(dict)
    for r in rows:
        by_key[r.key()][r.stack] = r
    out: dict[int, float | None] = {}
    for r in rows:
        base = by_key[r.key()].get(r.baseline) if r.baseline else None
        if base is None or r.median is None or not base.median:
            out[id(r)] = None
        else:
            out[id(r)] = r.median / base.median
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if abs(v) >= 100:
        return f"{v:,.0f}"
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.2f}"


def markdown(rows: list[Row], meta: dict[str, Any]) -> str:
    """The Markdown report."""
    rat = ratios(rows)
    lines = [
        "# polymux benchmark results",
        "",
        f"- date: {meta['date']}",
        f"- command: `{meta['command']}`",
        f"- machine: {meta['machine']}",
        f"- versions: {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}",
        f"- mode: {meta['mode']}; figures are medians of {meta['repeat']} interleaved repeats (A/B/A/B)",
        f"- pinned: {meta.get('pinned', 'no')}",
        (
            "- sender (and the opening side) in this process, receiver in a child process "
            "(benchmarks/peer.py) with the same event loop; `benchmarks/bench_bulk.py --receiver inline` "
            "keeps the one-process variant"
        ),
        (
            "- ratio = polymux / baseline of the same scenario, loop, transport and run "
            f"(`{RAW_STREAMS}`: asyncio streams; `{RAW_PROTOCOL}`: plain asyncio.Protocol)"
        ),
    ]
    lines += [f"- note: {n}" for n in meta.get("notes", [])]
    lines.append("")
    lines += _targets(rows, rat)
    scenarios: dict[str, list[Row]] = defaultdict(list)
    for r in rows:
        scenarios[r.scenario].append(r)
    for name, srows in scenarios.items():
        lines += [f"## {name}", ""]
        if name == "scale":
            lines += [
                (
                    "| loop | transport | case | format | tracemalloc B/ch (opener) | RSS B/ch (opener) "
                    "| RSS B/ch (receiver, handler task each) | RSS B/ch (receiver, ChannelProtocols) "
                    "| open s | note |"
                ),
                "|---|---|---|---|---|---|---|---|---|---|",
            ]
            for r in srows:
                e = r.extra
                lines.append(
                    f"| {r.loop} | {r.transport} | {r.case} | {r.stack} | {_fmt(e.get('tracemalloc_per_ch'))} "
                    f"| {_fmt(e.get('rss_per_ch'))} | {_fmt(e.get('peer_rss_per_ch'))} "
                    f"| {_fmt(e.get('peer_rss_per_ch_protocols'))} | {_fmt(e.get('open_s'))} | {'; '.join([*r.errors, e.get('limit', '')]).strip('; ')[:120]} |"
                )
            lines.append("")
            continue
        if name == "slow reader":
            lines += [
                "| loop | transport | case | stack | receiver peak RSS growth KiB | x receive window | note |",
                "|---|---|---|---|---|---|---|",
            ]
            for r in srows:
                lines.append(
                    f"| {r.loop} | {r.transport} | {r.case} | {r.stack} | {_fmt(r.median)} "
                    f"| {_fmt(r.extra.get('peak_growth_over_window'))} | {'; '.join(r.errors)[:120]} |"
                )
            lines.append("")
            continue
        lines += [
            "| loop | transport | case | stack | median | unit | ratio | vs | min..max | runs | note |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in srows:
            ratio = rat[id(r)]
            lines.append(
                f"| {r.loop} | {r.transport} | {r.case} | {r.stack} | {_fmt(r.median)} | {r.unit} "
                f"| {f'**{ratio:.2f}x**' if ratio is not None else '-'} | {r.baseline or ''} "
                f"| {_fmt(min(r.values)) if r.values else '-'}..{_fmt(max(r.values)) if r.values else '-'} "
                f"| {len(r.values)}/{len(r.values) + len(r.errors)} | {'; '.join(r.errors)[:120]} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _targets(rows: list[Row], rat: dict[int, float | None]) -> list[str]:
    out = [
        "## Targets (the issue asks for uvloop, TCP, full mode)",
        "",
        "| target | loop | transport | format | measured | met |",
        "|---|---|---|---|---|---|",
    ]
    n = len(out)
    for scenario, case, formats, minimum, wording in TARGETS:
        for r in rows:
            if r.scenario != scenario or r.case != case or r.baseline != RAW_STREAMS:
                continue
            if r.stack.endswith((NODE_SUFFIX, GO_SUFFIX)) or r.stack == RAW_PROTOCOL:
                continue
            if formats and r.stack not in formats:
                continue
            ratio = rat[id(r)]
            met = "-" if ratio is None else ("yes" if ratio >= minimum else "**no**")
            out.append(
                f"| {wording} | {r.loop} | {r.transport} | {r.stack} "
                f"| {'-' if ratio is None else f'{ratio:.2f}x'} | {met} |"
            )
    # polymux against the reference implementations of its formats, bulk, same run: Node
    # (1 channel: ahead of it) and the Go library (every channel count: at least as fast).
    bulk = {(r.loop, r.transport, r.case, r.stack): r for r in rows if r.scenario == "bulk"}
    for (loop, transport, case, stack), r in bulk.items():
        if stack.endswith(NODE_SUFFIX) and case == "1 ch":
            fmt, target = stack[: -len(NODE_SUFFIX)], "bulk 1 ch ahead of the Node reference (polymux / Node)"
        elif stack.endswith(GO_SUFFIX):
            fmt, target = stack[: -len(GO_SUFFIX)], f"bulk {case}: polymux / the Go library (>= 1x)"
        else:
            continue
        mine = bulk.get((loop, transport, case, fmt))
        if mine is None or mine.median is None or not r.median:
            continue
        ratio = mine.median / r.median
        met = ratio > 1 if stack.endswith(NODE_SUFFIX) else ratio >= 1
        out.append(
            f"| {target} | {loop} | {transport} | {fmt} "
            f"| {ratio:.2f}x ({mine.median:,.0f} vs {r.median:,.0f} MiB/s) | {'yes' if met else '**no**'} |"
        )
    for r in rows:
        if r.scenario == "scale" and r.values:
            per = r.extra.get("tracemalloc_per_ch", r.values[0])
            rss = r.extra.get("rss_per_ch")
            peer = r.extra.get("peer_rss_per_ch")
            light = r.extra.get("peer_rss_per_ch_protocols")
            # The receiver counts with the lighter way of serving idle channels it offers
            # (ChannelProtocols: no task per channel); both figures are printed.
            receiver = light if light is not None else peer
            worst = max(per, rss or 0, receiver or 0)
            out.append(
                f"| idle channels < 4 KiB each, per side ({r.case}) | {r.loop} | {r.transport} | {r.stack} "
                f"| opener {per:,.0f} B traced / {_fmt(rss)} B RSS, receiver {_fmt(light)} B RSS with "
                f"ChannelProtocols ({_fmt(peer)} B with a handler task each) "
                f"| {'yes' if worst < 4096 else '**no**'} |"
            )
    if len(out) == n:
        out.append("| (no target rows in this run) | | | | | |")
    return [*out, ""]


def write_json(path: Path, rows: list[Row], meta: dict[str, Any]) -> None:
    """results.json: meta and every row with its repeats, median and ratio."""
    rat = ratios(rows)
    data = {"meta": meta, "rows": [{**r.to_json(), "ratio": rat[id(r)]} for r in rows]}
    path.write_text(json.dumps(data, indent=1, default=str) + "\n")


NO_PLOTS = (
    "no plots: matplotlib is not installed (it comes with the bench extra: pip install 'polymux[bench]')"
)
"""What the suite says instead of its plots when matplotlib is missing."""


def plots_if_possible(out: Path, rows: list[Row]) -> tuple[list[Path], str | None]:
    """:func:`plots`, or none and :data:`NO_PLOTS` without matplotlib: the tables and
    results.json of a run that took minutes are not lost for want of its plots."""
    try:
        return plots(out, rows), None
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] != "matplotlib":
            raise
        return [], NO_PLOTS


def plots(out: Path, rows: list[Row]) -> list[Path]:
    """PNG plots: bulk MiB/s against channel count, message rate against message size (one
    figure per loop and transport, a line per stack)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written: list[Path] = []
    for scenario, xlabel, ylabel, stem in (
        ("bulk", "channels (connections for the raw baselines)", "MiB/s (median)", "bulk_vs_channels"),
        ("messages", "message size (bytes)", "messages/s (median)", "messages_vs_size"),
        ("rr", "channels (connections for raw)", "round trips/s (median)", "rr_vs_channels"),
    ):
        groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
        for r in rows:
            if r.scenario == scenario and r.x is not None and r.median is not None:
                groups[(r.loop, r.transport)].append(r)
        for (loop, transport), grows in groups.items():
            fig, ax = plt.subplots(figsize=(9, 4.8))
            ax.set_prop_cycle(color=[plt.get_cmap("tab20")(i % 20) for i in range(40)])
            stacks: dict[str, list[tuple[float, float]]] = defaultdict(list)
            for r in grows:
                assert r.x is not None and r.median is not None
                stacks[r.stack].append((r.x, r.median))
            for stack, pts in sorted(stacks.items()):
                pts.sort()
                style = (
                    "--"
                    if stack in (RAW_STREAMS, RAW_PROTOCOL)
                    else (":" if NODE_SUFFIX in stack else "-." if GO_SUFFIX in stack else "-")
                )
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, marker="o", label=stack)
            ax.set_xscale("log", base=2)
            xs = sorted({p[0] for pts in stacks.values() for p in pts})
            ax.set_xticks(xs, [f"{x:g}" for x in xs])
            ax.set_xlabel(xlabel)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{scenario}: {loop}, {transport}")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
            fig.tight_layout()
            path = out / f"{stem}_{loop}_{transport}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(path)
    return written


def load(path: Path) -> tuple[list[Row], dict[str, Any]]:
    """Rows and meta back from a results.json."""
    data = json.loads(path.read_text())
    names = set(Row.__dataclass_fields__)
    rows = [Row(**{k: v for k, v in r.items() if k in names}) for r in data["rows"]]
    return rows, data["meta"]


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.report DIR...``: re-render results.md and the plots of each
    results directory from its results.json (e.g. after merging runs or changing tables)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for d in args.dirs:
        rows, meta = load(d / "results.json")
        (d / "results.md").write_text(markdown(rows, meta))
        plots(d, rows)
        print(f"re-rendered {d / 'results.md'} ({len(rows)} rows)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
