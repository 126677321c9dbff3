"""A real local AIStore cluster (1 proxy + 2 targets on 127.0.0.1) for development and CI.

Command line::

    python -m aisio.cluster start    # installs aisnode if missing, prints AIS_ENDPOINT=http://127.0.0.1:PORT
    python -m aisio.cluster status   # says whether it runs (exit status 0 when it does)
    python -m aisio.cluster stop     # stops the nodes and removes their data

Python::

    from aisio.cluster import LocalCluster
    cluster = LocalCluster.start()      # or LocalCluster.running() to find one
    print(cluster.endpoint)
    cluster.stop()

One module per concern:

- :mod:`aisio.cluster.build`: the aisnode binary, built once with Go into
  ``$WDS_DATAPIPES_CACHE/bin/aisnode`` (default cache: ``~/.cache/wds-datapipes``).
- :mod:`aisio.cluster.config`: folders, ports and the nodes' configs. Configs, logs and
  mountpaths go to a fresh folder under ``$AISIO_RUN_DIR`` or the system temp folder,
  which must be on a filesystem with ``user.*`` extended attributes (ext4, xfs; not tmpfs).
- :mod:`aisio.cluster.process`: :class:`LocalCluster`, which starts, watches, faults
  (signals, restarts) and stops the nodes, and keeps its state in
  ``<cache>/cluster/state.json`` so that ``stop`` and ``status`` work from any process.
- :mod:`aisio.cluster.__main__`: the command line.

Linux only (``/proc``, user xattrs).
"""

from .build import AISTORE_VERSION, BUILD_TAGS, aisnode_path, ensure_aisnode
from .config import FAST_FAILOVER, ClusterError, cache_dir, cluster_config, local_config, supports_user_xattrs
from .process import LocalCluster, NodeExitedError, NodeState, cluster_endpoint, report_to_stderr

__all__ = [
    "AISTORE_VERSION", "BUILD_TAGS", "FAST_FAILOVER", "ClusterError", "LocalCluster", "NodeExitedError", "NodeState",
    "aisnode_path", "cache_dir", "cluster_config", "cluster_endpoint", "ensure_aisnode", "local_config",
    "report_to_stderr", "supports_user_xattrs",
]
