"""AIStore as a source and sink for wds_datapipes.

Importing ``aisio`` registers the ``ais://`` scheme with the core's opener registry
(``load_tar`` then streams AIS objects; worker processes also find it through the
``wds_datapipes.backends`` entry point, :mod:`aisio.backend`), with webdataset's URL opener (so
``webdataset.WebDataset("ais://...")`` works too), and the ``list_ais_shards`` functional name.

- :class:`AISSourceLister`: list shards in a bucket (``list_ais_shards``).
- :func:`open_ais_url`: the ``ais`` opener, from any byte offset; rides out dropped
  connections and node faults (:mod:`aisio.streams`, :mod:`aisio.retry`, :mod:`aisio.nodes`).
- :class:`ShardUploader`: a ``ShardWriter(post=...)`` callback that uploads each shard.
- :func:`dsort_shuffle`: shuffle samples across shards on the cluster (dSort).
- :mod:`aisio.etl`: thin helpers over the SDK's ETL API (Kubernetes clusters only);
  :mod:`aisio.local_etl`: the same ETL classes run in the reading worker (``etl_local=``).
- :mod:`aisio.errors`: the library's AIS errors and the one place that translates failures.
- :mod:`aisio.compat`: the aistore SDK's removed DataPipes' argument names;
  :mod:`aisio.wds_opener`: ``ais://`` in plain webdataset pipelines.
- :mod:`aisio.cluster`: a local 1-proxy/2-target cluster for development and CI.

The cluster is the one ``$AIS_ENDPOINT`` names; :func:`set_endpoint` sets it. Reads and
listings retry for :func:`set_retry_budget` seconds without progress (default 60).
"""

from wds_datapipes.shards.openers import register_backend

from .backend import BACKEND
from .client import AISUrl, endpoint, fast_retry_config, get_client, set_endpoint
from .compat import AISFileLister, AISFileLoader
from .dsort import dsort_framework, dsort_shuffle, dsort_spec
from .errors import AISReadError, DsortError, ETLError, UploadError
from .listing import AISSourceLister, list_objects
from .opener import open_ais_url
from .retry import RetryPolicy, set_retry_budget
from .streams import AISObjectStream
from .upload import ShardUploader, upload_file
from .wds_opener import register_with_webdataset

register_backend(BACKEND, replace=True)
register_with_webdataset()

__all__ = [
    "AISFileLister", "AISFileLoader", "AISObjectStream", "AISReadError", "AISSourceLister", "AISUrl", "DsortError", "ETLError", "RetryPolicy",
    "ShardUploader", "UploadError", "dsort_framework", "dsort_shuffle", "dsort_spec", "endpoint", "fast_retry_config",
    "get_client", "list_objects", "open_ais_url", "set_endpoint", "set_retry_budget", "upload_file",
]
