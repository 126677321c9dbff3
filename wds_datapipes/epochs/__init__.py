"""Exact epochs: every rank the same number of batches, every sample once, resumable anywhere.

The pure parts, with no I/O: ``spans`` (runs of samples), ``plan`` (an epoch's order,
split and shuffle, and the rest of an interrupted one) and ``state`` (the few integers a
checkpoint keeps). The parts that read: ``index`` (the shard index: sample counts and
offsets), ``places`` (where each member's bytes lie), ``placed_reads`` and
``placed_shuffle`` (reading by those places), ``reading`` (a reader's share of an epoch)
and ``exact_epochs`` (the ``ExactEpochs`` pipe).
"""
