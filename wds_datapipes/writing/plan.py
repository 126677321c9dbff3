"""The writer's plan: which sample goes to which shard, and which rank writes which shard.

Pure (no I/O, nothing read from the environment, nothing printed): a function of the
samples' sizes, ``maxcount``, ``maxsize`` and the world size alone, so every rank and
every run with the same input and settings makes the same plan. A resumed run, the
ranks of a multi-machine conversion, and any number of worker processes therefore agree
on each shard's samples without talking to each other.

Two plans: by size (:func:`assign_shards`: the samples that pass the writer's checks, by
count and bytes), and by place (:func:`row_shard`: every input, skipped or not, takes one
of ``maxcount`` places), for inputs whose count is known without reading them (Parquet
footers): then a rank reads only the row groups of its own shards (:func:`groups_to_read`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from ..errors import ShardWriteError
from ..tar.build import header_size
from ..tar.headers import BLOCK

_BIG = 8**11  # a size the ustar field cannot hold (8 GiB): a PAX record for it


def member_cost(name: str, size: int) -> int:
    """The tar bytes one member named ``name`` takes: its header, as the tar builder writes it
    (:func:`~wds_datapipes.tar.build.header_size`: one block, or a PAX header before it), and
    its data padded to a block."""
    return header_size(name, size) + -(-size // BLOCK) * BLOCK


def sample_cost(key: str, fields: Sequence[tuple[str, int]]) -> int:
    """The tar bytes of a sample from its key and its (suffix, size) fields: exactly what the
    writer writes for them (member names ``<key>.<suffix>``).

    Raises :class:`~wds_datapipes.errors.ShardWriteError` for a name no tar holds: one with
    a NUL, or a lone surrogate that is not a file name's undecodable byte."""
    total = 0
    plain = key.isascii() and "\0" not in key
    for suffix, size in fields:  # a loop, not sum() of a generator: once a sample, in the writer's parent
        if plain and len(key) + len(suffix) < 100 and size < _BIG and suffix.isascii() and "\0" not in suffix:
            total += BLOCK + -(-size // BLOCK) * BLOCK  # the builder's one-block case, without building the name
            continue
        try:
            total += member_cost(f"{key}.{suffix}", size)
        except UnicodeEncodeError as exn:
            raise ShardWriteError(f"the member name {key}.{suffix!r} cannot be written: {exn.reason} at "
                                  f"{exn.start} (a name must be text, or a file name's bytes as os.listdir "
                                  "gives them)", key=key) from None
        except ValueError as exn:  # a NUL in the name
            raise ShardWriteError(str(exn), key=key) from None
    return total


def assign_shards(costs: Iterable[int], maxcount: int | None = None, maxsize: int | None = None) -> Iterator[int]:
    """Yields each sample's shard number, in order: a shard takes samples until one more
    would pass ``maxcount`` samples or ``maxsize`` bytes, its end blocks counted (a sample
    bigger than ``maxsize`` gets a shard of its own). Neither limit: one shard."""
    planner = ShardPlanner(maxcount, maxsize)
    for cost in costs:
        yield planner.shard_of(cost)


class ShardPlanner:
    """:func:`assign_shards` one sample at a time: :meth:`shard_of` gives the next sample's
    shard number from its cost (a writer planning as it reads calls it once a sample: no
    chain of generators between the input and the plan)."""

    __slots__ = ("count", "maxcount", "maxsize", "shard", "size")

    def __init__(self, maxcount: int | None = None, maxsize: int | None = None):
        if maxcount is not None and maxcount < 1:
            raise ValueError(f"maxcount must be >= 1, not {maxcount}")
        if maxsize is not None and maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, not {maxsize}")
        self.maxcount, self.maxsize = maxcount, maxsize
        self.shard, self.count, self.size = 0, 0, 2 * BLOCK  # a shard ends with two zero blocks

    def shard_of(self, cost: int) -> int:
        """The shard of the next sample, of ``cost`` tar bytes."""
        if self.count and ((self.maxcount is not None and self.count >= self.maxcount) or
                           (self.maxsize is not None and self.size + cost > self.maxsize)):
            self.shard, self.count, self.size = self.shard + 1, 0, 2 * BLOCK
        self.count += 1
        self.size += cost
        return self.shard


def writes_shard(shard: int, rank: int, world: int) -> bool:
    """Whether ``rank`` of ``world`` writes shard ``shard`` (round robin: disjoint, none left out)."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of {world}")
    return shard % world == rank


class Counted:
    """An input that takes its place in the plan but is not read here: a row of another rank's
    shard (only its key, where known, is kept: keys must be unique across every rank's inputs)."""

    __slots__ = ("key",)

    def __init__(self, key: str | None):
        self.key = key

    def __repr__(self) -> str:
        return f"Counted({self.key!r})"


def row_shard(row: int, maxcount: int | None) -> int:
    """The shard of input ``row`` (counted from 0) in a plan by place: every input, written or
    skipped, takes one of a shard's ``maxcount`` places (None: one shard)."""
    return 0 if maxcount is None else row // maxcount


def groups_to_read(group_rows: Iterable[int], maxcount: int | None, rank: int, world: int) -> list[bool]:
    """For consecutive groups of inputs (Parquet row groups) of these sizes, planned by place
    (:func:`row_shard`), whether each holds an input of a shard ``rank`` writes: a group that
    straddles shards is read by every rank writing one of them."""
    if maxcount is not None and maxcount < 1:
        raise ValueError(f"maxcount must be >= 1, not {maxcount}")
    wanted, start = [], 0
    for rows in group_rows:
        first, last = row_shard(start, maxcount), row_shard(start + rows - 1, maxcount)
        wanted.append(rows > 0 and any(writes_shard(shard, rank, world)
                                       for shard in range(first, min(last, first + world - 1) + 1)))
        start += rows
    return wanted


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


__all__ = ["Counted", "ShardPlanner", "assign_shards", "groups_to_read", "member_cost", "row_shard", "runs",
           "sample_cost", "writes_shard"]
