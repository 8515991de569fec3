"""``python -m simsim.cli``: the same as the ``simsim`` command."""

from __future__ import annotations

import sys

from simsim.cli import main

if __name__ == "__main__":
    sys.exit(main())
