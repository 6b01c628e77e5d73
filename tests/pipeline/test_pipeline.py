"""The pipeline on captures the tests make: exact per-channel bytes for every format, a
Node reference peer session and a pcap; stalls of a slow reader; an injected violation at
its offset; pings; lifetimes; the files written."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pandas as pd
import pytest

import polymux

from .conftest import Captures
from .scenarios import CHANNELS, HOLD, ROTATED


if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from polymux.pipeline import Summary


pytestmark = pytest.mark.spark


def channel_pairs(traffic: pd.DataFrame, session: str) -> list[tuple[int, int]]:
    """Sorted (c2s, s2c) data bytes of the session's channels that carried data."""
    rows = traffic[(traffic["session"] == session) & (traffic["channel"] != "")]
    table = rows.pivot_table(
        index="channel", columns="direction", values="data_bytes", aggfunc="sum", fill_value=0
    )
    for direction in ("c2s", "s2c"):
        if direction not in table:
            table[direction] = 0
    pairs = [(int(r.c2s), int(r.s2c)) for r in table.itertuples()]
    return sorted(p for p in pairs if p != (0, 0))


def test_frames_schema_is_the_tracing_contract() -> None:
    """The frames table starts with exactly polymux.tracing's FRAME_FIELDS."""
    from polymux import tracing
    from polymux.pipeline import FRAME_FIELDS, FRAME_TABLE_COLUMNS, frames_struct

    assert FRAME_FIELDS == tracing.FRAME_FIELDS
    struct = frames_struct()
    contract = tracing.frame_schema()
    assert struct.names[: len(contract.names)] == contract.names
    assert struct.names == FRAME_TABLE_COLUMNS
    for field in contract:
        assert struct[field.name].nullable == field.nullable, field.name


@pytest.mark.parametrize("fmt", polymux.PROTOCOLS)
def test_every_format_exact_bytes(analyzed: Summary, captures: Captures, fmt: str) -> None:
    """Per channel and direction, the report's data bytes are exactly what the session
    sent, from the capture of either side."""
    traffic = analyzed.tables["traffic"]
    sessions = captures.format_sessions[fmt]
    assert len(sessions) == 2
    for session in sessions:
        assert channel_pairs(traffic, session) == captures.expected.pairs[session], (fmt, session)
        assert set(traffic[traffic["session"] == session]["format"]) == {captures.expected.formats[session]}
    if fmt in ROTATED:
        files = list((captures.root / "formats" / fmt).glob("*.pmcap.parquet"))
        assert len(files) > len(sessions), files  # decoded across rotated files
    row = analyzed.tables["sessions"].set_index("session").loc[sessions[0]]
    assert row["channels"] >= CHANNELS
    assert row["violations"] == 0


def test_every_session_exact_bytes(analyzed: Summary, captures: Captures) -> None:
    """Every session of the run (formats, Node peer, slow reader, pcap) is in the report
    with its exact per-channel bytes, and nothing else is."""
    traffic = analyzed.tables["traffic"]
    expected = captures.expected.pairs
    for session, pairs in expected.items():
        assert channel_pairs(traffic, session) == pairs, session
    reported = set(analyzed.tables["sessions"]["session"])
    assert reported == set(expected) | {captures.violation_session}


def test_node_reference_peer_session(analyzed: Summary, captures: Captures) -> None:
    """yamux between polymux (recorded, server) and npm @chainsafe/libp2p-yamux: exact bytes,
    the Node side's ping answered, the error stream reset."""
    session = captures.node_session
    assert channel_pairs(analyzed.tables["traffic"], session) == captures.expected.pairs[session]
    lifetimes = analyzed.tables["lifetimes"]
    mine = lifetimes[lifetimes["session"] == session]
    assert (mine["ended"] == "reset").sum() >= 1
    pings = analyzed.tables["pings"]
    answered = pings[(pings["session"] == session) & pings["answered_ns"].notna()]
    assert len(answered) >= 1
    assert (answered["rtt_ms"] >= 0).all()


def test_pcap_matches_the_recorded_session(analyzed: Summary, captures: Captures) -> None:
    """A pcap written with dpkt from the yamux client's capture reports the same traffic
    (per channel, direction, frames and bytes) as that capture."""
    traffic = analyzed.tables["traffic"]
    cols = ["channel", "direction", "frames", "data_frames", "data_bytes"]

    def view(session: str) -> pd.DataFrame:
        rows = traffic[traffic["session"] == session][cols]
        return rows.sort_values(["channel", "direction"]).reset_index(drop=True)

    assert not view(captures.pcap_session).empty
    pd.testing.assert_frame_equal(view(captures.pcap_session), view(captures.pcap_source))


def test_slow_reader_stalls_only_its_channel(analyzed: Summary, captures: Captures) -> None:
    """The channel whose reader stopped shows the sender at zero credit for about the time
    it stopped; the other channels of the session never stall."""
    session = captures.slow_session
    traffic = analyzed.tables["traffic"]
    mine = traffic[(traffic["session"] == session) & (traffic["direction"] == "c2s")]
    slow = mine[mine["data_bytes"] == captures.slow_size]["channel"]
    assert len(slow) == 1
    slow_channel = slow.iloc[0]
    totals = analyzed.tables["stall_totals"]
    stalled = totals[totals["session"] == session]
    assert set(stalled["channel"]) == {slow_channel}, stalled
    row = stalled[stalled["sender"] == "c2s"]
    assert len(row) == 1
    assert row["stalled_s"].iloc[0] >= HOLD * 0.75
    stalls = analyzed.tables["stalls"]
    mine = stalls[(stalls["session"] == session) & (stalls["channel"] == slow_channel)]
    intervals = mine[mine["sender"] == "c2s"]
    assert len(intervals) == row["stalls"].iloc[0]
    assert (intervals["ended_by"] == "credit").all()  # the reader came back before the end
    assert (intervals["end_ns"] >= intervals["start_ns"]).all()


def test_injected_violation_at_its_offset(analyzed: Summary, captures: Captures) -> None:
    """The bad yamux header is reported in the client's direction at its byte offset."""
    violations = analyzed.tables["violations"]
    mine = violations[violations["session"] == captures.violation_session]
    assert list(mine["kind"]) == ["violation"], mine
    row = mine.iloc[0]
    assert row["direction"] == "c2s"
    assert row["offset"] == captures.violation_offset
    assert "version" in row["error"]
    others = violations[violations["session"] != captures.violation_session]
    assert others.empty, others
    sessions = analyzed.tables["sessions"].set_index("session")
    assert sessions.loc[captures.violation_session, "violations"] == 1


def test_yamux_pings_have_rtts(analyzed: Summary, captures: Captures) -> None:
    """polymux's yamux client pings at connect: the ping, its pong and the RTT are found."""
    pings = analyzed.tables["pings"]
    for session in captures.format_sessions["yamux"]:
        mine = pings[pings["session"] == session]
        assert len(mine) >= 1, session
        assert mine["answered_ns"].notna().all()
        assert ((mine["rtt_ms"] >= 0) & (mine["rtt_ms"] < 5000)).all()


def test_lifetimes_every_channel_closed(analyzed: Summary, captures: Captures) -> None:
    """Every channel of the format sessions was opened and closed in the capture, so each
    has a lifetime that ends before the capture does."""
    lifetimes = analyzed.tables["lifetimes"]
    for fmt, sessions in captures.format_sessions.items():
        for session in sessions:
            mine = lifetimes[lifetimes["session"] == session]
            data = mine[(mine["data_bytes_c2s"] > 0) | (mine["data_bytes_s2c"] > 0)]
            assert len(data) == CHANNELS, (fmt, mine)
            assert (data["ended"] == "closed").all(), (fmt, data)
            assert (data["lifetime_s"] >= 0).all()
            assert (data["end_ns"] >= data["open_ns"]).all()


def test_throughput_adds_up_to_traffic(analyzed: Summary) -> None:
    """The 1-second windows add up to the per-channel totals."""
    keys = ["session", "channel", "direction"]
    windows = analyzed.tables["throughput"].groupby(keys)["bytes"].sum()
    traffic = analyzed.tables["traffic"]
    totals = traffic[traffic["data_bytes"] > 0].set_index(keys)["data_bytes"]
    pd.testing.assert_series_equal(windows.sort_index(), totals.sort_index(), check_names=False)


def test_files_written(analyzed: Summary, spark: SparkSession) -> None:
    """Every report as CSV and Parquet, the plots, index.html, and the frames table."""
    from polymux.pipeline import FRAME_TABLE_COLUMNS, REPORTS

    out = analyzed.out
    for name in REPORTS:
        csv = pd.read_csv(out / f"{name}.csv", keep_default_na=False)
        assert len(csv) == len(analyzed.tables[name]), name
        assert len(pd.read_parquet(out / f"{name}.parquet")) == len(analyzed.tables[name])
    page = (out / "index.html").read_text()
    assert '<img src="throughput.png"' in page and '<img src="stalls.png"' in page
    assert (out / "throughput.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "stalls.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    frames = spark.read.parquet(str(out / "frames"))
    assert frames.columns == FRAME_TABLE_COLUMNS
    assert frames.count() == analyzed.frames == int(analyzed.tables["sessions"]["frames"].sum())
