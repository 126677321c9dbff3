"""TensorBoard scalars of a snapshot, through any ``SummaryWriter`` (torch's or tensorboardX's).

:func:`to_tensorboard` writes one scalar per number under ``wds_datapipes/...`` tags and
returns them, tag by tag. The snapshot's counts and seconds are totals since ``enable()``;
TensorBoard plots their growth (its smoothing shows the rate), and the wait's shares are the
loop's so far. Nothing here runs unless called: stats on without it cost nothing more.
"""

from __future__ import annotations

from typing import Any

from ..snapshot import Snapshot, current

__all__ = ["scalars", "to_tensorboard"]

PREFIX = "wds_datapipes"

# What each tag group holds: (group, attribute of the stage / source).
_STAGE_FIELDS = ("seconds", "items", "bytes", "errors", "retries")
_SOURCE_FIELDS = ("samples", "objects", "bytes", "read_seconds", "open_seconds", "retries", "errors",
                  "cache_hits", "cache_misses", "cache_bytes")
_WAIT_FIELDS = ("steps", "blocked_seconds", "step_seconds", "first_seconds", "longest_seconds", "readiness",
                "wait_share", "stall_per_batch")
_RANKS_FIELDS = ("stall_min", "stall_median", "stall_max", "throughput_min", "throughput_median",
                 "throughput_max")


def scalars(numbers: Snapshot) -> dict[str, float]:
    """The scalars :func:`to_tensorboard` writes for ``numbers``, tag by tag (pure)."""
    out: dict[str, float] = {}
    for name, stage in numbers.stages.items():
        for field in _STAGE_FIELDS:
            out[f"{PREFIX}/stage_{field}/{name}"] = float(getattr(stage, field))
    for group, table in (("source", numbers.sources), ("scheme", numbers.schemes)):
        for name, source in table.items():
            for field in _SOURCE_FIELDS:
                out[f"{PREFIX}/{group}_{field}/{name}"] = float(getattr(source, field))
    for worker in numbers.workers:
        out[f"{PREFIX}/worker_busy_seconds/{worker.rank}.{worker.worker}"] = worker.busy_seconds
    if numbers.wait is not None:
        for field in _WAIT_FIELDS:
            out[f"{PREFIX}/wait/{field}"] = float(getattr(numbers.wait, field))
    for mix in numbers.mixtures:
        key = f"{mix.mixer}/{mix.epoch}/{mix.source}"
        out[f"{PREFIX}/mixture_realized/{key}"] = mix.realized
        out[f"{PREFIX}/mixture_target/{key}"] = mix.target
    if numbers.ranks is not None:
        for field in _RANKS_FIELDS:
            out[f"{PREFIX}/ranks/{field}"] = float(getattr(numbers.ranks, field))
        straggler = numbers.ranks.straggler
        out[f"{PREFIX}/ranks/straggler"] = float(-1 if straggler is None else straggler)
    return out


def to_tensorboard(writer: Any, step: int, numbers: Snapshot | None = None) -> dict[str, float]:
    """Writes the numbers of ``numbers`` (default: a snapshot taken now) as scalars at ``step``
    through ``writer`` (a ``torch.utils.tensorboard.SummaryWriter``); returns them by tag.

    Tags: ``wds_datapipes/stage_<field>/<stage>`` (seconds, items, bytes, errors, retries of
    every stage, derived ones' seconds), ``wds_datapipes/source_<field>/<source>`` and
    ``wds_datapipes/scheme_<field>/<scheme>`` (samples, objects, bytes, read and open seconds,
    retries, errors, cache hits, misses and bytes), ``wds_datapipes/worker_busy_seconds/<rank>.<worker>``,
    ``wds_datapipes/wait/<field>`` (steps, blocked, step, first and longest seconds, readiness,
    wait share, stall per batch), ``wds_datapipes/mixture_{realized,target}/<mixer>/<epoch>/<source>``,
    ``wds_datapipes/ranks/<field>`` and ``wds_datapipes/ranks/straggler`` (-1: none).

    Call it every few hundred steps: it reads each worker's record (a small file) and writes
    a few dozen scalars. With stats off it writes nothing.

    Example:
        >>> writer = SummaryWriter("runs/data")
        >>> for step, batch in enumerate(wd.stats.watch(loader)):
        ...     if step % 200 == 0:
        ...         wd.stats.to_tensorboard(writer, step)
    """
    numbers = numbers if numbers is not None else current()
    if not numbers.enabled:
        return {}
    written = scalars(numbers)
    for tag, value in written.items():
        writer.add_scalar(tag, value, step)
    return written
