"""Opt-in tracing of polymux sessions, and decoding of what crossed the wire.

* :class:`CaptureRecorder` records each session's raw bytes (both directions, timestamped)
  into rotating Parquet files, and optionally the decoded frames
  (``SessionConfig(capture=CaptureRecorder(directory))``). Off by default; nearly free
  when off.
* :func:`read_capture` / :func:`read_capture_bytes` read a capture file back;
  :func:`read_pcap` / :func:`read_pcap_bytes` reassemble the TCP flows of a pcap or pcapng
  file (tcpdump, tshark) into the same chunks.
* :func:`decode_chunks` decodes chunks with the :mod:`polymux.wire` codecs into
  :class:`FrameRecord` rows (:data:`FRAME_FIELDS`), passively: never raises on bad input;
  :func:`decode_batches` gives the same records as Arrow record batches (vectorised where
  a format's walk can), for the pipeline.
* :func:`detect` tells the format from the first bytes of each direction (with the
  evidence, a confidence, and "ambiguous: mplex or multiplex" where the bytes cannot
  tell); :func:`decode_flow` decodes a connection as the detected format, retrying the
  other candidates when it fails early; :func:`detect_format` is the short form.
* :func:`diagnose` says why there is no session with a peer from its first bytes: what it
  sent, what it speaks when that can be named with confidence (another format, HTTP, TLS,
  SSH), and what to try.

The file format and the record fields are documented in ``docs/tracing.md``. Nothing here
imports pyspark; pyarrow (captures) and dpkt (pcap) are imported when used.
"""

from __future__ import annotations

from polymux.tracing.capture import (
    CAPTURE_VERSION,
    Capture,
    CaptureRecorder,
    read_capture,
    read_capture_bytes,
    read_session,
)
from polymux.tracing.decode import FrameDecoder, decode_batches, decode_chunks
from polymux.tracing.detect import (
    DecodedFlow,
    Detection,
    decode_flow,
    detect,
    detect_chunks,
    detect_format,
    forced_format,
    heads,
    parse_protocols,
)
from polymux.tracing.diagnose import NAME_CONFIDENCE, Diagnosis, diagnose
from polymux.tracing.pcap import Flow, read_pcap, read_pcap_bytes
from polymux.tracing.records import C2S, FRAME_FIELDS, FRAME_TYPES, S2C, Chunk, FrameRecord, frame_schema


__all__ = [
    "C2S",
    "CAPTURE_VERSION",
    "FRAME_FIELDS",
    "FRAME_TYPES",
    "NAME_CONFIDENCE",
    "S2C",
    "Capture",
    "CaptureRecorder",
    "Chunk",
    "DecodedFlow",
    "Detection",
    "Diagnosis",
    "Flow",
    "FrameDecoder",
    "FrameRecord",
    "decode_batches",
    "decode_chunks",
    "decode_flow",
    "detect",
    "detect_chunks",
    "detect_format",
    "diagnose",
    "forced_format",
    "frame_schema",
    "heads",
    "parse_protocols",
    "read_capture",
    "read_capture_bytes",
    "read_pcap",
    "read_pcap_bytes",
    "read_session",
]
