"""``python -m polymux``: the same as the ``polymux`` command."""

from __future__ import annotations

import sys

from polymux.cli import main


if __name__ == "__main__":
    sys.exit(main())
