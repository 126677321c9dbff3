"""A dataset's endless run of passes, cut into epoch windows with no sample twice in a window.

Pure (no I/O, no torch): a function of the shard sizes, a seed and a few integers.

Pass ``q`` lays the shards end to end in an order drawn from (seed, q)
(:func:`pass_sequence`). Epochs of a fixed count (``ExactEpochs(samples_per_epoch=)``, a
mixture's sources) are consecutive windows over the passes, each starting where the last
ended (:class:`Cursor`). The rule they keep:

- **A window of at most a pass holds no sample twice.** One that reaches the end of its
  pass with ``f`` samples still to take does not go on into the next pass (whose new order
  may well start with samples it just took): it takes ``f`` samples of its pass that lie
  before it (the pass's first ``f``, which earlier windows gave), and the next pass leaves
  those ``f`` out once (the cursor's ``skip``). So over passes every sample comes equally
  often, within one, and every window starts a pass's read where the last left it.
- **A longer window** (a share larger than the dataset) takes whole passes in between and
  holds each sample at most ``ceil(count / size)`` times.

Only after a window of another count (a resumed run's new counts) can the ``f`` samples
not all be found before it; then the pass's skipped samples and its next ones come, and
those next ones one time more over passes than the rest.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .spans import SpanList

# Domain tags keep the random streams of different decisions apart.
_SHARD_ORDER = 0x5A4D


def rng(*key: int) -> np.random.Generator:
    """The generator of one decision, keyed by integers (a domain tag first, then seed, epoch, ...)."""
    return np.random.default_rng([k & 0xFFFFFFFFFFFFFFFF for k in key])


def shard_order(n_shards: int, seed: int, pass_index: int, shuffle: bool) -> np.ndarray:
    """The order of the shards in one pass over the data: a permutation drawn from (seed, pass)."""
    if not shuffle:
        return np.arange(n_shards, dtype=np.int64)
    return rng(_SHARD_ORDER, seed, pass_index).permutation(n_shards)


def pass_sequence(sizes: Sequence[int], seed: int, pass_index: int, shuffle: bool) -> SpanList:
    """Every sample once: whole shards, in the pass's order."""
    sizes = np.asarray(sizes, dtype=np.int64)
    order = shard_order(len(sizes), seed, pass_index, shuffle)
    return SpanList(order, np.zeros(len(order), dtype=np.int64), sizes[order])


@dataclass(frozen=True)
class Cursor:
    """Where a dataset's next window starts: ``offset`` samples into pass ``pass_index``,
    a pass that leaves out the first ``skip`` samples of pass ``skip_pass``'s order (a
    window before gave them twice)."""

    pass_index: int = 0
    offset: int = 0
    skip_pass: int = 0
    skip: int = 0


def pass_rest(sizes: Sequence[int], seed: int, shuffle: bool, cursor: Cursor) -> SpanList:
    """The samples of the cursor's pass, in its order, less those it skips."""
    sequence = pass_sequence(sizes, seed, cursor.pass_index, shuffle)
    if not cursor.skip:
        return sequence
    skipped = pass_sequence(sizes, seed, cursor.skip_pass, shuffle).slice(0, cursor.skip)
    first = np.zeros(len(np.asarray(sizes)), dtype=np.int64)
    first[skipped.shards] = skipped.stops  # a pass's prefix holds each shard's first samples
    return SpanList(sequence.shards, first[sequence.shards], sequence.stops)


def _fillers(cursor: Cursor, count: int, total: int) -> tuple[int, int, int, int]:
    """A window from ``cursor`` that passes its pass's end: (its rest of the pass, whole passes
    after it, samples still to take, whether they are fillers (1) or the next pass's head (0))."""
    rest = total - cursor.skip - cursor.offset
    whole, left = divmod(count - rest, total)
    return rest, whole, left, int(left <= cursor.offset + cursor.skip)


def window(sizes: Sequence[int], seed: int, shuffle: bool, cursor: Cursor, count: int) -> SpanList:
    """The ``count`` samples of the window at ``cursor`` (see the module's rule), in order."""
    total = int(np.sum(np.asarray(sizes, dtype=np.int64)))
    if count <= 0:
        return SpanList([], [], [])
    if total == 0:
        raise ValueError("an epoch of samples needs at least one sample in the shards")
    rest = pass_rest(sizes, seed, shuffle, cursor)
    o, q = cursor.offset, cursor.pass_index
    if o + count <= len(rest):
        return rest.slice(o, o + count)
    _, whole, left, fill = _fillers(cursor, count, total)
    parts = [rest.slice(o, len(rest))]
    parts += [pass_sequence(sizes, seed, q + 1 + i, shuffle) for i in range(whole)]
    if not fill:  # more than the pass holds outside this window: the next pass's start
        parts.append(pass_sequence(sizes, seed, q + whole + 1, shuffle).slice(0, left))
    elif left <= o:  # the pass's first samples: all before this window's part of it
        parts.append(pass_sequence(sizes, seed, q, shuffle).slice(0, left))
    elif left <= cursor.skip:  # the samples this pass skipped
        parts.append(pass_sequence(sizes, seed, cursor.skip_pass, shuffle).slice(0, left))
    else:  # after a window of another count: all it skipped, then its first samples
        parts.append(pass_sequence(sizes, seed, cursor.skip_pass, shuffle).slice(0, cursor.skip))
        parts.append(rest.slice(0, left - cursor.skip))
    return SpanList.join(parts)


def advance(cursor: Cursor, count: int, total: int, stop: str | None = None) -> Cursor:
    """Where the window after the one of ``count`` samples at ``cursor`` starts; with
    ``stop="all_exhausted"``, at the start of a new pass."""
    if count <= 0 or total <= 0:
        return cursor
    q, o = cursor.pass_index, cursor.offset
    if o + count < total - cursor.skip:
        return Cursor(q, o + count, cursor.skip_pass, cursor.skip)
    _, whole, left, fill = _fillers(cursor, count, total) if o + count > total - cursor.skip else (0, 0, 0, 1)
    following = q + whole + 1
    if not fill:
        after = Cursor(following, left)
    elif not left:
        after = Cursor(following)
    elif left <= o:
        after = Cursor(following, 0, q, left)
    elif left <= cursor.skip:
        after = Cursor(following, 0, cursor.skip_pass, left)
    else:  # the skipped ones came once in this pass: the next one skips them again
        after = Cursor(following, 0, cursor.skip_pass, cursor.skip)
    if stop == "all_exhausted" and (after.offset or after.skip):
        after = Cursor(after.pass_index + 1)
    return after


_WALKS: dict[tuple, list[Cursor]] = {}
_WALKS_LOCK = threading.Lock()


def cursor_after(start: Cursor, count: int, total: int, steps: int, stop: str | None = None) -> Cursor:
    """The cursor ``steps`` windows of ``count`` after ``start`` (walks are kept, so that the
    epochs of a run cost one step each)."""
    key = (start, count, total, stop)
    with _WALKS_LOCK:
        walk = _WALKS.get(key)
        if walk is None:
            if len(_WALKS) >= 4096:
                _WALKS.clear()
            walk = _WALKS[key] = [start]
        while len(walk) <= steps:
            walk.append(advance(walk[-1], count, total, stop))
        return walk[steps]
