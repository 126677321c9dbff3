"""Exact epochs: every rank the same number of batches, every sample once, resumable anywhere.

The pure parts, with no I/O: ``spans`` (runs of samples), ``plan`` (an epoch's order,
split and shuffle, and the rest of an interrupted one), ``mixture`` and ``orders`` (the
same for a mixture of datasets) and ``state`` (the few integers a checkpoint keeps). The
parts that read: ``index`` (the shard index: sample counts and offsets), ``places`` (where
each member's bytes lie), ``placed_reads`` and ``placed_shuffle`` (reading by those
places), ``reading`` (a reader's share of an epoch), ``epoch_pipe`` (what the source pipes
share: the loaders' hooks, epochs, the state) and the pipes, ``exact_epochs``
(``ExactEpochs``) and ``mixed_epochs`` (``MixedEpochs``).
"""
