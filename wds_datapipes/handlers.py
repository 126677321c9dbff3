"""Error policies shared by every stage (``handler=``).

A handler is called with the exception a stage caught. It either raises (the run
stops) or returns ``True``: the stage then skips the bad shard, member or sample and
goes on. Whatever is skipped is logged on the ``wds_datapipes`` logger, so nothing is
lost silently.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable

logger = logging.getLogger("wds_datapipes")

Handler = Callable[[BaseException], bool]


def reraise_exception(exn: BaseException) -> bool:
    """Stop the run: re-raise the error (the default of every stage)."""
    raise exn


def warn_and_continue(exn: BaseException) -> bool:
    """Emit a warning naming what is skipped, log it, and go on."""
    warnings.warn(f"skipped: {exn}", stacklevel=2)
    logger.warning("skipped: %s", exn)
    return True


def ignore_and_continue(exn: BaseException) -> bool:
    """Go on without a warning; what is skipped is still logged at INFO level."""
    logger.info("skipped: %s", exn)
    return True
