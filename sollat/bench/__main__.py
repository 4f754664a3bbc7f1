"""``python -m sollat.bench {bench,sol,barrier,plot} ...``."""

import sys

from .cli import main

sys.exit(main())
