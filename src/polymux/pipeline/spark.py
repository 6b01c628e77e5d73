"""A quiet SparkSession for the pipeline, and the one-line-per-stage progress reporter.

Facts this module relies on (measured on PySpark 4.3, see docs/pipeline.md):

- the JVM's logging is chosen when it starts: a log4j2 properties file at level ``error``
  in ``SPARK_CONF_DIR`` silences it (we write one to a private folder unless the user set
  ``SPARK_CONF_DIR`` already);
- ``SPARK_LOCAL_IP=127.0.0.1`` avoids the hostname warning and binding elsewhere;
- Python workers run ``PYSPARK_PYTHON`` (else the ``python3`` on PATH, which may not have
  polymux): we point it at ``sys.executable`` when we start Spark ourselves;
- a master set in code overrides ``spark-submit --master``: under ``spark-submit`` we take
  the running context's master and set nothing that only matters at JVM start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TextIO


if TYPE_CHECKING:
    from pyspark.sql import SparkSession


__all__ = ["Progress", "build_session", "sql_conf", "stop_quietly", "under_spark_submit"]

_LOG4J2 = """\
# Written by polymux.pipeline: Spark logs errors only.
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n%ex
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.netty.name = org.sparkproject.jetty
logger.netty.level = error
logger.native.name = org.apache.hadoop.util.NativeCodeLoader
logger.native.level = error
"""


def under_spark_submit() -> bool:
    """True when this Python process was started by ``spark-submit`` (the JVM is already
    running and owns the master, memory and logging settings)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def _quiet_conf_dir() -> str:
    """A folder holding only our log4j2 properties file (created once per user)."""
    folder = Path(tempfile.gettempdir()) / f"polymux-spark-conf-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    target = folder / "log4j2.properties"
    if not target.exists() or target.read_text() != _LOG4J2:
        tmp = folder / f".log4j2.{os.getpid()}.tmp"
        tmp.write_text(_LOG4J2)
        tmp.replace(target)
    return str(folder)


def build_session(
    master: str | None = None,
    *,
    app_name: str = "polymux-analyze",
    quiet: bool = True,
    driver_memory: str = "4g",
    fast_start: bool = False,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Return a SparkSession for the pipeline.

    Started here (plain ``python``/``polymux analyze``): master ``master`` (default
    ``local[*]``, embedded, nothing to start), UI off, no console progress bars, Spark logs
    at ``error`` only, workers on this interpreter. Under ``spark-submit`` the running
    context is used as it is (its ``--master`` wins) and only the log level is lowered.

    Args:
        master: Spark master URL; ignored under ``spark-submit``.
        app_name: application name.
        quiet: silence Spark's logging (errors only).
        driver_memory: the driver JVM heap when we start it (``local[*]`` runs executors
            in the driver).
        fast_start: C1-only JIT in the driver JVM (``-XX:TieredStopAtLevel=1``): starts
            several seconds faster, good for tests and small captures, slower on big ones.
        conf: more Spark settings.
    """
    from pyspark.sql import SparkSession

    if quiet:
        _drop_py4j_send_errors()  # a Ctrl-C while the JVM starts: py4j's traceback of it
    if under_spark_submit():
        spark = SparkSession.builder.appName(app_name).getOrCreate()
        if quiet:
            spark.sparkContext.setLogLevel("ERROR")
        return spark
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if quiet and "SPARK_CONF_DIR" not in os.environ:
        os.environ["SPARK_CONF_DIR"] = _quiet_conf_dir()
    builder = (
        SparkSession.builder.master(master or "local[*]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", driver_memory)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
    )
    if fast_start:
        builder = builder.config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    before = _children()
    try:
        spark = builder.getOrCreate()
    except KeyboardInterrupt:
        # Ctrl-C while the JVM starts: pyspark stops waiting for it and removes the folder
        # it was to write into, and the JVM, which ignores SIGINT, would print a Java stack
        # about that after we exited. It is ours and half-started: end it now.
        for pid in _children() - before:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        raise
    if quiet:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _children() -> set[int]:
    """The processes this one started (Linux: /proc; elsewhere none are known)."""
    me = os.getpid()
    found: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == me:  # the field after the state: ppid
            found.add(int(name))
    return found


def stop_quietly(spark: SparkSession, *, stop: bool = True) -> None:
    """After Ctrl-C: Spark's logging off (every task killed would log an error with its
    Java stack), the jobs cancelled, and the session stopped if ``stop`` (before the driver
    exits, so the JVM says nothing after it). Errors are ignored: the JVM may be going too."""
    _drop_py4j_send_errors()
    with contextlib.suppress(Exception):
        spark.sparkContext.setLogLevel("OFF")
        spark.sparkContext.cancelAllJobs()
        if stop:
            spark.stop()


class _DropPy4jSendErrors(logging.Filter):
    """Drops py4j's "... while sending command." records (it logs them on the root logger)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().endswith("while sending command.")


def _drop_py4j_send_errors() -> None:
    """Drop py4j's "... while sending command." records from now on: it logs them, with
    tracebacks, on the root logger when a call is interrupted (Ctrl-C) or the JVM is gone;
    the call raises all the same."""
    root = logging.getLogger()
    if not any(isinstance(f, _DropPy4jSendErrors) for f in root.filters):
        root.addFilter(_DropPy4jSendErrors())


@contextmanager
def sql_conf(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """Set SQL settings for the duration of the block (they apply when a query runs),
    then restore the previous values."""
    previous: dict[str, str | None] = {}
    for key, value in settings.items():
        previous[key] = spark.conf.get(key, None)
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in previous.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)


class Progress:
    """One line per pipeline stage on stderr: ``polymux analyze: ingest ... 2.31 s (detail)``."""

    def __init__(
        self, enabled: bool = True, stream: TextIO | None = None, prefix: str = "polymux analyze"
    ) -> None:
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.prefix = prefix
        self.timings: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str) -> Iterator[dict[str, str]]:
        """Time a stage; the block may put a ``detail`` text into the yielded dict."""
        info: dict[str, str] = {}
        start = time.perf_counter()
        yield info
        elapsed = time.perf_counter() - start
        self.timings[name] = elapsed
        if self.enabled:
            detail = f" ({info['detail']})" if info.get("detail") else ""
            print(f"{self.prefix}: {name:<8} {elapsed:7.2f} s{detail}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """A line that is not a stage (start-up facts)."""
        if self.enabled:
            print(f"{self.prefix}: {text}", file=self.stream, flush=True)
