"""`python -m e2e.local`: the same as `modelpool-local`."""

import sys

from e2e.local.cli import main

sys.exit(main())
