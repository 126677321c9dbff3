"""Managing ETLs: thin helpers over the SDK's ETL API, for clusters that run on Kubernetes.

AIStore runs an ETL as containers next to its targets, so only a cluster deployed on
Kubernetes, with aisnode built with the ``etl`` tag, can init one. The local cluster of
:mod:`aisio.cluster` cannot: there, ``init_etl`` fails and a GET that names an ETL gets
HTTP 501 (or 404 for an unknown ETL), which the ``ais`` opener reports as one
:class:`~wds_datapipes.errors.ShardOpenError` naming the ETL, the object and the answer.

Reading through an ETL::

    init_etl("resize", image="my-registry/resize-etl:1", comm_type="hpush")
    pipe = AISSourceLister("ais://train/shard-", etl_name="resize", etl_args={"size": 224})

    init_etl_class("resize", Resize)   # an ETLServer subclass, deployed as the ETL 'resize'
    pipe = AISSourceLister("ais://train/shard-", etl_name="resize", etl_args={"size": 224})
    pipe = AISSourceLister("ais://train/shard-", etl_args={"size": 224}, etl_local=Resize)  # run here

These helpers add nothing but errors of our own type (:class:`ETLError`) that say which
ETL and which cluster; each is one SDK call.
"""

from __future__ import annotations

from aistore.sdk.types import ETLInfo

from .client import endpoint, get_client
from .errors import ETLError, translating

_HINT = " (ETLs need a cluster on Kubernetes with aisnode built with the 'etl' tag)"


def _call(what: str, fn):
    cluster = endpoint()
    with translating(ETLError, cluster=cluster, doing=f"{what} on {cluster}", hint=_HINT):
        return fn()


def init_etl(name: str, image: str, *, command: list[str] | str | None = None, comm_type: str = "hpush",
             init_timeout: str = "5m", obj_timeout: str = "45s", **env: str) -> str:
    """Start the ETL ``name`` from a container ``image`` (``Etl.init``); returns the job id.

    ``comm_type`` is how targets talk to it: ``hpush``, ``hpull`` or ``ws``. ``env``
    becomes environment variables in the ETL container.
    """
    etl = get_client().etl(name)
    return _call(f"init ETL {name!r}", lambda: etl.init(image=image, command=command, comm_type=comm_type,
                                                 init_timeout=init_timeout, obj_timeout=obj_timeout, **env))


def init_etl_class(name: str, server_class: type, **init_class_args) -> str:
    """Deploy the ETL server class ``server_class`` as the ETL ``name`` (the SDK's
    ``Etl.init_class``: the class travels serialized and runs in AIStore's Python runtime);
    returns ``name``. The same class runs in the reader with ``etl_local=`` (see
    :mod:`aisio.local_etl`). ``init_class_args``: ``dependencies``, ``comm_type``, ``init_timeout``...
    """
    etl = get_client().etl(name)
    _call(f"init ETL {name!r} from class {server_class.__qualname__}", lambda: etl.init_class(**init_class_args)(server_class))
    return name


def list_etls(stages: list[str] | None = None) -> list[ETLInfo]:
    """The cluster's ETLs in ``stages`` (default: running), as the SDK's ``ETLInfo``."""
    return _call("list ETLs", lambda: get_client().cluster().list_etls(stages))


def stop_etl(name: str) -> None:
    """Stop the ETL ``name`` (its containers stop; it can be started again)."""
    _call(f"stop ETL {name!r}", get_client().etl(name).stop)


def start_etl(name: str) -> None:
    """Start the stopped ETL ``name`` again."""
    _call(f"start ETL {name!r}", get_client().etl(name).start)


def delete_etl(name: str) -> None:
    """Delete the stopped ETL ``name``."""
    _call(f"delete ETL {name!r}", get_client().etl(name).delete)
