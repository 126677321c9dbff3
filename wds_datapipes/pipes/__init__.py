"""Pipes over samples: ``fields`` (``to_tuple``, ``rename_keys``, ``map_fields``), ``shuffling``
(``shuffle_samples``), ``batching`` (``batch_samples`` and ``collate``) and ``mixing``
(``RandomMix``: several pipes drawn from at random by weight)."""
