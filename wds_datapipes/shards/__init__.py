"""Reading shards: from URL specs to WebDataset samples.

``listing`` (``ShardLister``: expand, shuffle and split shard URLs), ``openers`` (one
registry of URL schemes: local files, ``file:``, HTTP, ``pipe:``), ``http_stream`` (HTTP
that resumes), ``tar_loader`` (``load_tar``: members out of each shard, through
:mod:`wds_datapipes.tar`) and ``grouping`` (``group_by_key``: members into samples).
"""
