"""Allow `python -m apps` (the `veritrain` command without the console script on PATH)."""

import sys

from apps.cli import main

sys.exit(main())
