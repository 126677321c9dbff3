"""Pipes over samples: ``fields`` (``to_tuple``, ``rename_keys``, ``map_fields``), ``shuffling``
(``shuffle_samples``) and ``batching`` (``batch_samples`` and ``collate``)."""
