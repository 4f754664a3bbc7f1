"""``python -m sollat.bench VERB ...``: the same command line as ``python -m sollat``."""

import sys

from ..cli import main

sys.exit(main())
