"""The writer's plan: which sample goes to which shard, and which rank writes which shard.

Pure (no I/O, nothing read from the environment, nothing printed): a function of the
samples' sizes, ``maxcount``, ``maxsize`` and the world size alone, so every rank and
every run with the same input and settings makes the same plan. A resumed run, the
ranks of a multi-machine conversion, and any number of worker processes therefore agree
on each shard's samples without talking to each other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..tar.headers import BLOCK


def member_cost(name_bytes: int, size: int) -> int:
    """The tar bytes one member takes: its header (with a PAX header where its name needs
    one, roughly) and its data padded to a block."""
    header = BLOCK if name_bytes <= 100 else 3 * BLOCK + name_bytes
    return header + -(-size // BLOCK) * BLOCK


def sample_cost(key: str, fields: Sequence[tuple[str, int]]) -> int:
    """The tar bytes of a sample from its key and its (suffix, size) fields."""
    length = len(key.encode("utf-8", "surrogateescape")) + 1
    return sum(member_cost(length + len(suffix.encode()), size) for suffix, size in fields)


def assign_shards(costs: Iterable[int], maxcount: int | None = None, maxsize: int | None = None) -> Iterator[int]:
    """Yields each sample's shard number, in order: a shard takes samples until one more
    would pass ``maxcount`` samples or ``maxsize`` bytes, its end blocks counted (a sample
    bigger than ``maxsize`` gets a shard of its own). Neither limit: one shard."""
    if maxcount is not None and maxcount < 1:
        raise ValueError(f"maxcount must be >= 1, not {maxcount}")
    if maxsize is not None and maxsize < 1:
        raise ValueError(f"maxsize must be >= 1, not {maxsize}")
    shard, count, size = 0, 0, 2 * BLOCK  # a shard ends with two zero blocks
    for cost in costs:
        if count and ((maxcount is not None and count >= maxcount) or
                      (maxsize is not None and size + cost > maxsize)):
            shard, count, size = shard + 1, 0, 2 * BLOCK
        count += 1
        size += cost
        yield shard


def writes_shard(shard: int, rank: int, world: int) -> bool:
    """Whether ``rank`` of ``world`` writes shard ``shard`` (round robin: disjoint, none left out)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return shard % world == rank


def runs(numbers: Iterable[int]) -> Iterator[tuple[int, int, int]]:
    """(shard, first sample, end sample) for each run of equal shard numbers (sample numbers
    counted from 0), as :func:`assign_shards` yields them."""
    start, current, at = 0, None, 0
    for at, shard in enumerate(numbers):
        if shard != current:
            if current is not None:
                yield current, start, at
            start, current = at, shard
    if current is not None:
        yield current, start, at + 1


__all__ = ["assign_shards", "member_cost", "runs", "sample_cost", "writes_shard"]
