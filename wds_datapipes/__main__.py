"""``python -m wds_datapipes``: see :mod:`wds_datapipes.cli`."""

import sys

from .cli import main

sys.exit(main())
