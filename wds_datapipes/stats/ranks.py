"""Across ranks: one small collective over the process group, the spread of the wait and the straggler.

Each rank sends five numbers (its rank, and its steps, wait, step time and wall time since its
previous gather) in one ``all_gather`` of a float64 tensor, on the CUDA device under nccl and
on the CPU otherwise. Nothing runs unless asked for: :func:`gather_ranks` by hand, or
``watch(loader, gather_every=n)``. :func:`rank_stats` turns the rows into numbers (pure).
"""

from __future__ import annotations

import time

from .recorder import recorder_for
from .settings import current_settings
from .snapshot import RanksStats, RankStats, spread

# A rank is the straggler when its wait per batch is over STRAGGLER_RATIO times the others'
# median and over it by STRAGGLER_MIN_S: one rank waiting on its data holds every other rank
# at the next collective of the step, so their own wait stays low.
STRAGGLER_RATIO = 1.5
STRAGGLER_MIN_S = 0.001
_FIELDS = 5


def gather_ranks(group=None) -> RanksStats:
    """Every rank's wait since its previous gather, gathered over ``group`` (default: the world).

    A collective: every rank of the group must call it at the same point (the same step).
    It works with stats off too (that rank sends zeros), so that no rank is left waiting.
    The result is kept for the next :func:`~wds_datapipes.stats.snapshot` (``ranks``).
    """
    import torch
    import torch.distributed as dist

    settings = current_settings()
    recorder = recorder_for(settings) if settings is not None else None
    mine = [float(dist.get_rank(group) if group is not None else dist.get_rank()), 0.0, 0.0, 0.0, 0.0]
    now = time.perf_counter_ns()
    if recorder is not None:
        wait = recorder.wait
        counts = (wait.steps, wait.blocked_ns, wait.step_ns) if wait is not None else (0, 0, 0)
        last = getattr(recorder, "gathered", None) or (0, 0, 0, recorder.started_ns)
        mine[1:] = [counts[0] - last[0], (counts[1] - last[1]) * 1e-9, (counts[2] - last[2]) * 1e-9,
                    (now - last[3]) * 1e-9]
        recorder.gathered = (*counts, now)
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    tensor = torch.tensor(mine, dtype=torch.float64, device=device)
    rows = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, tensor, group=group)
    result = rank_stats([row.cpu().tolist() for row in rows])
    if recorder is not None:
        recorder.ranks = result
    return result


def rank_stats(rows: list[list[float]]) -> RanksStats:
    """The ranks' numbers from the gathered rows (rank, steps, wait s, step s, wall s), and the
    straggler: the rank that waits longest per batch, where it waits clearly more than the others."""
    ranks = []
    for rank, steps, blocked, step, wall in rows:
        total = blocked + step
        ranks.append(RankStats(int(rank), int(steps), blocked / steps if steps else 0.0,
                               blocked / total if total > 0 else 0.0, steps / wall if wall > 0 else 0.0))
    ranks.sort(key=lambda r: r.rank)
    stalls = [r.stall_per_batch for r in ranks]
    throughputs = [r.batches_per_s for r in ranks]
    straggler = None
    if len(ranks) > 1:
        worst = max(ranks, key=lambda r: r.stall_per_batch)
        others = spread([r.stall_per_batch for r in ranks if r is not worst])[1]
        if worst.stall_per_batch > STRAGGLER_RATIO * others and worst.stall_per_batch - others > STRAGGLER_MIN_S:
            straggler = worst.rank
    return RanksStats(tuple(ranks), *spread(stalls), *spread(throughputs), straggler)
