"""`python -m dpc_maintainer.classroom`: the command line (cli.py)."""
from __future__ import annotations

import sys

from dpc_maintainer.classroom.cli import main

if __name__ == "__main__":
    sys.exit(main())
