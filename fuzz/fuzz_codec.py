"""atheris harness: one wire codec's incremental decoder fed arbitrary bytes.

    .venv/bin/python fuzz/fuzz_codec.py --format mstream-v2 -atheris_runs=100000 [corpus dir]

Only :class:`polymux.ProtocolError` may escape; the decoder holds back at most one frame
(see ``polymux_fuzz.drive_codec``). A crash is a finding.
"""

from __future__ import annotations

import atheris


with atheris.instrument_imports(include=["polymux", "polymux_fuzz"]):
    import polymux_fuzz

    polymux_fuzz.import_all()  # engines and codecs are imported lazily: instrument them now

from _atheris_main import run


if __name__ == "__main__":
    run(polymux_fuzz.drive_codec, polymux_fuzz.FORMATS)
