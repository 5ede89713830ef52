"""Allow `python -m veritrain`."""

import sys

from veritrain.cli import main

sys.exit(main())
