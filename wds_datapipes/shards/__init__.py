"""Reading shards: from URL specs to WebDataset samples.

``listing`` (``ShardLister``: expand, shuffle and split shard URLs), ``openers`` (one
registry of URL schemes: local files, ``file:``, HTTP, ``pipe:``), ``http_stream`` (HTTP
that resumes), ``tar_loader`` (``load_tar``: members out of each shard, through
:mod:`wds_datapipes.tar`), ``grouping`` (``group_by_key``: members into samples), and the
shard cache under ``open_shard``: ``cache`` (the settings, the counters, the layer),
``cache_store`` (the directory, its ledger and locks), ``cache_streams`` (what readers of
a cached shard get: the copy, a download written as it is read, or a read along one).
"""
