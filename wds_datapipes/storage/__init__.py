"""Storage back ends: what the readers and the writer need of each place shards live.

``backend`` (the record one URL scheme registers: open from a byte, stamp, list, put). The
registry itself is :mod:`wds_datapipes.shards.openers` (one for every scheme); this room
holds what the back ends share and the back ends that are not AIStore's (``aisio`` is its
own package, registered through the same record).
"""
