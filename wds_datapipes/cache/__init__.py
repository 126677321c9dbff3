"""The shard cache: one copy per machine of the remote shards read, under a size limit.

``layer`` (turning it on: ``set_cache``, ``get_cache``; the counters; the layer it puts under
``open_shard`` through :func:`~wds_datapipes.shards.openers.set_stream_layer`), ``settings``
(``CacheSettings``), ``store`` (the directory's ledger: entries, reservations, eviction),
``streams`` (what readers of a cached shard get: the copy, a download written as it is read,
or a read along one). It builds on ``shards`` (the openers, and ``shards.files``: a directory
only its owner writes, locks, copies published by a rename); the readers above it
(``epochs``) ask it for a shard's complete copy. Nothing in ``shards`` imports it: the package
loads ``layer`` with the pipes (``wds_datapipes._PUBLIC``), so a process that reads with
``load_tar`` (a DataLoader worker unpickling one, too) has the layer in place, and ``load_tar``
reports the counters at an epoch's end through ``openers.report_stream_layer``.
"""
