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

from .errors import redact

logger = logging.getLogger("wds_datapipes")

#: What every stage's ``handler=`` takes: called with the error a stage caught, it raises (the run
#: stops) or returns True (the bad shard, member or sample is skipped, and logged).
Handler = Callable[[BaseException], bool]

# Every sample of an exact epoch (ExactEpochs) carries this flag (True for pad repeats).
EXACT_EPOCH_FLAG = "__pad__"


def reraise_exception(exn: BaseException) -> bool:
    """Stop the run: re-raise the error (the default of every stage)."""
    raise exn


def warn_and_continue(exn: BaseException) -> bool:
    """Emit a warning naming what is skipped, log it, and go on."""
    shown = redact(str(exn))  # a foreign error may show a URL's secrets
    warnings.warn(f"skipped: {shown}", stacklevel=2)
    logger.warning("skipped: %s", shown)
    return True


def ignore_and_continue(exn: BaseException) -> bool:
    """Go on without a warning; what is skipped is still logged at INFO level."""
    logger.info("skipped: %s", exn)
    return True


def skips(handler: Handler, error: BaseException, sample: object = None) -> bool:
    """Whether the stage skips what raised ``error``: ``handler``'s choice (it may raise).

    A sample of an exact epoch is never skipped one by one: the batches after it would
    shift, a rank could end with a batch less than the others (a DDP hang), and a resumed
    run would be off by the skipped samples. Its error is raised, with that reason.
    """
    if isinstance(sample, dict) and EXACT_EPOCH_FLAG in sample:
        raise type(error)(
            f"{error} [a sample of an exact epoch cannot be skipped: later batches would shift. "
            "Use decode_batches(..., handler=...), whose skips leave a batch smaller in its place, "
            "or fix the data (python -m wds_datapipes verify)]"
        ) from error
    return handler(error)
