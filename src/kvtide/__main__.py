"""`python -m kvtide` is the `kvtide` command."""

import sys

from kvtide.cli import main

sys.exit(main())
