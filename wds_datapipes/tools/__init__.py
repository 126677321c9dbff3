"""Tools over whole pipelines and loaders, above every room: ``profile`` (``python -m wds_datapipes
profile``: each stage alone and the pipeline whole, with 1 and N loader workers, measured by
:mod:`wds_datapipes.stats`; the named recipes it profiles)."""
