"""``python -m wds_datapipes``: see :mod:`wds_datapipes.cli` (the same as the ``wds-datapipes`` command)."""

import sys

from .cli import main

sys.exit(main(prog="python -m wds_datapipes"))
