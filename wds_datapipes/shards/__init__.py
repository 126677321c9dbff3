"""Reading shards: from URL specs to WebDataset samples.

``listing`` (``ShardLister``: expand, shuffle and split shard URLs), ``openers`` (one
registry of URL schemes: local files, ``file:``, HTTP, ``pipe:``), ``http_stream`` (HTTP
that resumes), ``tar_loader`` (``load_tar``: members out of each shard, through
:mod:`wds_datapipes.tar`), ``grouping`` (``group_by_key``: members into samples), and the
shard cache under ``open_shard``: ``cache`` (turning it on, the counters, the layer),
``cache_settings`` (``CacheSettings``), ``cache_store`` (the directory's ledger),
``cache_streams`` (what readers of a cached shard get: the copy, a download written as it
is read, or a read along one), ``files`` (a directory only its owner writes, files made
without following links, locks, copies published by a rename).
"""
