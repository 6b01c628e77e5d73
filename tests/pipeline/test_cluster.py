"""The same job on a standalone Spark cluster: a master and a worker on 127.0.0.1 (started
from the pyspark package with ``spark-class``), the job submitted with ``spark-submit`` and
polymux shipped as a ``--py-files`` zip; its report files equal the ``local[2]`` ones."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
import pytest

import polymux

from .conftest import Captures, ensure_java


if TYPE_CHECKING:
    from polymux.pipeline import Summary


pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

FAST_JVM = "-XX:TieredStopAtLevel=1"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_port(port: int, proc: subprocess.Popen[bytes], log: Path, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)  # polling a port with a deadline
    pytest.fail(f"nothing listened on {port} within {limit} s:\n{log.read_text()[-3000:]}")


def _zip_polymux(target: Path) -> Path:
    package = Path(polymux.__file__).parent
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, Path("polymux") / path.relative_to(package))
    return target


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(15)


def test_spark_submit_to_standalone_cluster_matches_local(
    analyzed: Summary, captures: Captures, tmp_path: Path
) -> None:
    import pyspark

    from polymux.pipeline.spark import _quiet_conf_dir

    spark_home = Path(pyspark.__file__).parent
    env = {
        **os.environ,
        "JAVA_HOME": ensure_java(),
        "SPARK_HOME": str(spark_home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_CONF_DIR": _quiet_conf_dir(),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        # C1-only JIT: every JVM here starts seconds faster and the data is small
        "SPARK_DAEMON_JAVA_OPTS": "-XX:TieredStopAtLevel=1",
    }
    env.pop("PYSPARK_GATEWAY_PORT", None)
    env.pop("PYSPARK_GATEWAY_SECRET", None)
    spark_class = str(spark_home / "bin" / "spark-class")
    port = _free_port()
    url = f"spark://127.0.0.1:{port}"
    master_log, worker_log = tmp_path / "master.log", tmp_path / "worker.log"
    with master_log.open("wb") as mlog, worker_log.open("wb") as wlog:
        master = subprocess.Popen(
            [spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
            + ["--port", str(port), "--webui-port", str(_free_port())],
            stdout=mlog,
            stderr=subprocess.STDOUT,
            env=env,
        )
        worker = None
        try:
            _wait_port(port, master, master_log)
            worker = subprocess.Popen(
                [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1"]
                + ["--cores", "2", "--memory", "2g", "--webui-port", str(_free_port())]
                + ["--work-dir", str(tmp_path / "work"), url],
                stdout=wlog,
                stderr=subprocess.STDOUT,
                env=env,
            )
            out = tmp_path / "report"
            script = Path(polymux.__file__).parent / "pipeline" / "__main__.py"
            result = subprocess.run(
                [str(spark_home / "bin" / "spark-submit"), "--master", url]
                + ["--py-files", str(_zip_polymux(tmp_path / "polymux.zip"))]
                + ["--conf", "spark.ui.enabled=false", "--conf", "spark.executor.memory=1g"]
                + ["--conf", "spark.ui.showConsoleProgress=false", "--driver-memory", "1g"]
                + ["--conf", f"spark.driver.extraJavaOptions={FAST_JVM}"]
                + ["--conf", f"spark.executor.extraJavaOptions={FAST_JVM}"]
                + [str(script), str(captures.root), "--out", str(out), "--protocol", "yamux"],
                env=env,
                capture_output=True,
                timeout=480,
                check=False,
            )
            # spark-submit merges the Python driver's stderr into its stdout
            log = (result.stdout + result.stderr).decode(errors="replace")
            assert result.returncode == 0, log[-5000:] + worker_log.read_text()[-2000:]
        finally:
            if worker is not None:
                _stop(worker)
            _stop(master)
    assert f"master {url}, from spark-submit" in log, log[-3000:]
    for name in analyzed.tables:
        cluster = pd.read_csv(out / f"{name}.csv", keep_default_na=False)
        local = pd.read_csv(analyzed.out / f"{name}.csv", keep_default_na=False)
        pd.testing.assert_frame_equal(cluster, local, obj=name)
    assert (out / "index.html").exists()
