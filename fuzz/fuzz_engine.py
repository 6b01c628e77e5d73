"""atheris harness: one sans-I/O engine fed arbitrary received bytes.

    .venv/bin/python fuzz/fuzz_engine.py --format yamux -atheris_runs=100000 [corpus dir]

Only :class:`polymux.ProtocolError` may escape; output and tracked channels stay
proportional to the input (see ``polymux_fuzz.drive_engine``). A crash is a finding.
"""

from __future__ import annotations

import atheris


with atheris.instrument_imports(include=["polymux", "polymux_fuzz"]):
    import polymux_fuzz

    polymux_fuzz.import_all()  # engines and codecs are imported lazily: instrument them now

from _atheris_main import run


if __name__ == "__main__":
    run(polymux_fuzz.drive_engine, polymux_fuzz.FORMATS)
