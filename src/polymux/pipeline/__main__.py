"""``python -m polymux.pipeline INPUTS... --out DIR``: the same as ``polymux analyze``, and the
script to hand ``spark-submit`` (see docs/pipeline.md)::

    spark-submit --master spark://host:7077 --py-files polymux.zip \\
        path/to/polymux/pipeline/__main__.py captures/ --out report/
"""

from __future__ import annotations

import sys
from pathlib import Path


if (
    __name__ == "__main__"
    and sys.path
    and Path(sys.path[0] or ".").resolve() == Path(__file__).parent.resolve()
):
    # Run as a script (spark-submit): Python put this package's folder first on sys.path,
    # where its modules would shadow top-level ones. Drop it.
    del sys.path[0]


def main() -> int:
    """Parse ``analyze``'s arguments and run it."""
    from polymux.cli import main as cli_main

    return cli_main(["analyze", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
