"""``analyze`` on packet captures of every format (``tests/tracing/flows.py``: the npm
reference peers and polymux through a recording proxy), each file alone and all files in
one call (where one mplex/multiplex flow used to be taken for yamux), and the one file
holding every flow. Each session: the expected format, how it was detected (the
``detection`` column), the data bytes each way, the channel names and no violation."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

from tracing.flows import FLOW_NAMES, MadeFlow, flows_by_name


if TYPE_CHECKING:
    from pyspark.sql import SparkSession


pytestmark = [pytest.mark.spark, pytest.mark.interop, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def flows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, MadeFlow]:
    return flows_by_name(tmp_path_factory.mktemp("flows"))


def check_sessions(tables: dict[str, pd.DataFrame], flows: list[MadeFlow]) -> None:
    sessions = tables["sessions"].set_index("session")
    assert sorted(sessions.index) == sorted(f.session for f in flows)
    traffic = tables["traffic"]
    lifetimes = tables["lifetimes"]
    for flow in flows:
        row = sessions.loc[flow.session]
        assert row["format"] == flow.format, flow.name
        expected = (
            f"ambiguous: mplex or multiplex (decoded as {flow.format}; "
            if flow.verdict.startswith("ambiguous")
            else f"detected {flow.format} (confidence "
        )
        assert row["detection"].startswith(expected), (flow.name, row["detection"])
        assert (" it fails at " in row["detection"]) == flow.retried, flow.name
        assert (row["data_bytes_c2s"], row["data_bytes_s2c"]) == (flow.c2s, flow.s2c), flow.name
        assert row["violations"] == 0, flow.name
        mine = traffic[traffic["session"] == flow.session]
        assert set(mine["channel_name"].dropna()) == flow.names, flow.name
        named = lifetimes[(lifetimes["session"] == flow.session) & lifetimes["channel_name"].notna()]
        assert set(named["channel_name"]) == flow.names, flow.name
    assert tables["violations"].empty


@pytest.mark.parametrize("name", FLOW_NAMES)
def test_analyze_each_capture_alone(
    spark: SparkSession, flows: dict[str, MadeFlow], name: str, tmp_path: Path
) -> None:
    from polymux.pipeline import analyze

    flow = flows[name]
    summary = analyze([str(flow.pcap)], tmp_path / "report", spark=spark, progress=False)
    assert summary.violations == 0
    check_sessions(summary.tables, [flow])


def test_analyze_all_captures_in_one_call(
    spark: SparkSession, flows: dict[str, MadeFlow], tmp_path: Path
) -> None:
    from polymux.pipeline import analyze

    files = [str(f.pcap) for f in flows.values()]
    summary = analyze(files, tmp_path / "report", spark=spark, progress=False)
    assert summary.sessions == len(flows) and summary.violations == 0
    check_sessions(summary.tables, list(flows.values()))
    page = (tmp_path / "report" / "index.html").read_text()
    assert "ambiguous: mplex or multiplex" in page  # the sessions table shows the detection


def test_analyze_one_file_with_every_flow(
    spark: SparkSession, flows: dict[str, MadeFlow], tmp_path: Path
) -> None:
    from polymux.pipeline import analyze

    pcap = next(iter(flows.values())).pcap.parent / "all.pcap"
    summary = analyze([str(pcap)], tmp_path / "report", spark=spark, progress=False)
    check_sessions(summary.tables, list(flows.values()))


def test_analyze_forces_a_format_per_flow(
    spark: SparkSession, flows: dict[str, MadeFlow], tmp_path: Path
) -> None:
    """``protocol={pattern: format}``: the matching flow is decoded as forced (its
    violations reported, no retry), the others detected."""
    from polymux.pipeline import analyze

    wrong = flows["mstream-v3"]
    pcap = next(iter(flows.values())).pcap.parent / "all.pcap"
    port = wrong.session.rsplit(":", 1)[1]
    summary = analyze(
        [str(pcap)], tmp_path / "report", protocol={f"*:{port}": "yamux"}, spark=spark, progress=False
    )
    sessions = summary.tables["sessions"].set_index("session")
    assert sessions.loc[wrong.session, "format"] == "yamux"
    assert sessions.loc[wrong.session, "detection"] == "forced (--protocol)"
    assert sessions.loc[wrong.session, "violations"] >= 1
    violations = summary.tables["violations"]
    assert set(violations["session"]) == {wrong.session}
    check_sessions(
        {name: table[table["session"] != wrong.session] for name, table in summary.tables.items()},
        [f for f in flows.values() if f is not wrong],
    )
