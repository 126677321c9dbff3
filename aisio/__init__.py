"""AIStore as a source and sink for wds_datapipes.

Importing ``aisio`` registers the ``ais://`` scheme with the core's opener registry
(``load_tar`` then streams AIS objects; worker processes also find it through the
``wds_datapipes.openers`` entry point) and the ``list_ais_shards`` functional name.

- :class:`AISSourceLister`: list shards in a bucket (``list_ais_shards``).
- :func:`open_ais_url`: the ``ais`` opener; resumes dropped connections with HTTP Range.
- :class:`ShardUploader`: a ``ShardWriter(post=...)`` callback that uploads each shard.
- :func:`dsort_shuffle`: shuffle samples across shards on the cluster (dSort).
- :mod:`aisio.etl`: thin helpers over the SDK's ETL API (Kubernetes clusters only).
- :mod:`aisio.cluster`: a local 1-proxy/2-target cluster for development and CI.

The cluster is the one ``$AIS_ENDPOINT`` names; :func:`set_endpoint` sets it.
"""

from wds_datapipes.openers import register_opener

from .client import AISUrl, endpoint, fast_retry_config, get_client, set_endpoint
from .dsort import DsortError, dsort_framework, dsort_shuffle, dsort_spec
from .listing import AISSourceLister, list_objects
from .streams import AISObjectStream, AISReadError, open_ais_url
from .upload import ShardUploader, UploadError, upload_file

register_opener("ais", open_ais_url)

__all__ = [
    "AISObjectStream", "AISReadError", "AISSourceLister", "AISUrl", "DsortError", "ShardUploader",
    "UploadError", "dsort_framework", "dsort_shuffle", "dsort_spec", "endpoint", "fast_retry_config", "get_client",
    "list_objects", "open_ais_url", "set_endpoint", "upload_file",
]
