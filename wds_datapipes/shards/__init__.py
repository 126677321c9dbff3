"""Reading shards: from URL specs to WebDataset samples.

``listing`` (``ShardLister``: expand, shuffle and split shard URLs), ``openers`` (one
registry of URL schemes: local files, ``file:``, HTTP, ``pipe:``), ``http_stream`` (HTTP
that resumes), ``tar_loader`` (``load_tar``: members out of each shard, through
:mod:`wds_datapipes.tar`), ``grouping`` (``group_by_key``: members into samples), and
``files`` (a directory only its owner writes, files made without following links, locks,
copies published by a rename). The shard cache, a layer under ``open_shard``, is the room
above: :mod:`wds_datapipes.cache`.
"""
