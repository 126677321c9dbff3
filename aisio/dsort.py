"""Shuffling samples across shards on the cluster with dSort.

dSort reads input shards, shuffles (or sorts) their records, and writes new shards of a
chosen size; a record is a whole sample (all the files that share a key). The cluster's
aisnode must be built with the ``dsort`` tag (``aisio.cluster`` builds it so).
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from aistore.sdk.dsort import DsortAlgorithm, DsortFramework, DsortShardsGroup
from aistore.sdk.multiobj import ObjectRange
from aistore.sdk.types import BucketModel

from wds_datapipes.errors import ShardOpenError

from .client import AISUrl, endpoint, get_client
from .errors import AIS_FAILURES, DsortError, server_message, status_of, translating
from .listing import list_objects

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)(?:\.\.\d+)?\}")
_FMT = re.compile(r"%(?:0(\d+))?d")  # AIStore's 'fmt' template: prefix-%06d-suffix, numbered from 0
# How long every target may answer "does not exist" for a job that started before that is an
# error: the proxy asks the targets of its current map (AIStore's own note: a target new to
# the map knows nothing of the job), so such an answer can pass while the map changes.
UNKNOWN_GRACE_S = 10.0


def _split_url(url: str) -> tuple[str, str]:
    aurl = AISUrl.parse(url)
    if aurl.etl_name:
        raise ValueError(f"dSort takes no ETL: {url!r}")
    return aurl.bucket, aurl.object


def _extension(template: str) -> str:
    for ext in (".tar.gz", ".tgz", ".tar.lz4", ".tar", ".zip"):
        if template.endswith(ext):
            return ext
    raise ValueError(f"cannot tell the shard format of {template!r} (expected .tar, .tgz, .tar.gz, .tar.lz4, .zip)")


def _template_regex(template: str) -> re.Pattern:
    """A regex matching the names an AIS brace template ({0000..9999}) or fmt template (%06d) can produce."""
    parts, last = [], 0
    for m in (_RANGE if _RANGE.search(template) else _FMT).finditer(template):
        parts.append(re.escape(template[last:m.start()]))
        parts.append(r"\d+")
        last = m.end()
    parts.append(re.escape(template[last:]))
    return re.compile("".join(parts) + r"\Z")


def dsort_framework(
    input_url: str,
    output_url: str,
    *,
    output_shard_size: str | int = "1MiB",
    seed: int | None = None,
    algorithm: str = "shuffle",
    description: str = "wds_datapipes shuffle",
) -> DsortFramework:
    """The SDK's description of a dSort job from ``input_url`` to ``output_url``.

    Args:
        input_url: ``ais://bucket/train-{000..099}.tar``, a brace template of input shards
            (one ``{first..last}`` range, as the SDK's ``ObjectRange`` takes it).
        output_url: ``ais://bucket/shuffled-{0000..9999}.tar``, a brace template with room
            for every output shard (dSort takes names from it in order). The SDK's
            description cannot hold AIStore's ``%d`` templates; :func:`dsort_spec` can.
        output_shard_size: the target size of each output shard, ``"10MiB"`` or bytes.
        seed: makes a shuffle repeatable (an integer >= 0).
        algorithm: ``"shuffle"`` (default), or ``"alphanumeric"`` to sort by key.
    """
    in_bucket, in_template = _split_url(input_url)
    out_bucket, out_template = _split_url(output_url)
    if seed is not None and seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    try:
        in_range, out_range = ObjectRange.from_string(in_template), ObjectRange.from_string(out_template)
    except ValueError as exn:
        raise ValueError(f"input and output must be brace templates like ais://b/train-{{000..099}}.tar: {exn}") from None
    return DsortFramework(
        input_shards=DsortShardsGroup(
            BucketModel(name=in_bucket, provider="ais"), "input", in_range, _extension(in_template)
        ),
        output_shards=DsortShardsGroup(
            BucketModel(name=out_bucket, provider="ais"), "output", out_range, _extension(out_template)
        ),
        algorithm=DsortAlgorithm(kind=algorithm, seed="" if seed is None else str(seed)),
        description=description,
        output_shard_size=str(output_shard_size),
    )


def dsort_spec(input_url: str, output_url: str, *, dsorter_type: str = "dsort_general", **kwargs) -> dict:
    """The JSON request (``POST /v1/sort``) that :func:`dsort_shuffle` sends; arguments as :func:`dsort_framework`.

    It names the ``dsorter_type``: left out, an AIStore 5.0 (v1.5.0) primary asks each
    target for its memory over intra-control without the sender headers the target
    requires, and the job fails to start with "stats.NodeStatus.Status: ReadString:
    expects \" or n". ``dsort_general`` is what it would pick below 100 GB of free memory
    per target; ``dsort_mem`` keeps records in memory.
    """
    out_bucket, out_template = _split_url(output_url)
    if _FMT.search(out_template) and not _RANGE.search(out_template):
        # AIStore numbers a 'fmt' template (shuffled-%d.tar, shuffled-%06d.tar) from 0 without
        # end; the SDK's description knows only brace ranges, so it carries a stand-in.
        stand_in = f"ais://{out_bucket}/{_FMT.sub('{0..1}', out_template, count=1)}"
        spec = dsort_framework(input_url, stand_in, **kwargs).to_spec()
        spec["output_format"] = out_template
    else:
        spec = dsort_framework(input_url, output_url, **kwargs).to_spec()
    spec["dsorter_type"] = dsorter_type
    return spec


def _output_names(bucket: str, template: str) -> list[str]:
    pattern = _template_regex(template)
    prefix = re.split(r"[{%]", template, maxsplit=1)[0]
    try:
        return [n for n in list_objects(bucket, prefix) if pattern.match(n)]
    except ShardOpenError as exn:
        raise DsortError(f"cannot list the outputs in ais://{bucket}: {exn.reason or exn}") from exn


def dsort_shuffle(
    input_url: str,
    output_url: str,
    *,
    output_shard_size: str | int = "1MiB",
    seed: int | None = None,
    algorithm: str = "shuffle",
    timeout: float = 300.0,
    overwrite: bool = False,
    poll_s: float = 0.25,
) -> list[str]:
    """Run a dSort job from ``input_url`` to ``output_url``, wait for it, return the output shard URLs (sorted).

    Every input sample lands whole in exactly one output shard, in a new order. See
    :func:`dsort_framework` for the arguments; ``timeout`` bounds the wait (the job is aborted
    then). Output names already in the bucket raise :class:`DsortError` unless
    ``overwrite=True``, which deletes them first, so that the result names only this
    job's shards.

    Example:
        >>> dsort_shuffle("ais://raw/train-{000..009}.tar", "ais://shuf/train-{0000..9999}.tar",
        ...               output_shard_size="10MiB", seed=0)
    """
    spec = dsort_spec(input_url, output_url, output_shard_size=output_shard_size, seed=seed, algorithm=algorithm)
    out_bucket, out_template = _split_url(output_url)
    client = get_client()
    where, cluster = AISUrl(out_bucket), endpoint()
    with translating(DsortError, where, cluster, doing=f"start dSort {input_url} -> {output_url}"):
        client.bucket(out_bucket).create(exist_ok=True)
        existing = _output_names(out_bucket, out_template)
        if existing and not overwrite:
            raise DsortError(
                f"{len(existing)} objects in ais://{out_bucket} already match {out_template!r} "
                f"(e.g. {existing[0]!r}): pass overwrite=True to delete them first"
            )
        if existing:
            client.bucket(out_bucket).objects(obj_names=existing).delete()
            _wait_gone(out_bucket, out_template, timeout=30.0)
        job = client.dsort()
        # The SDK's start() takes a DsortFramework, which cannot carry dsorter_type, or a
        # spec file, which it sends unchanged.
        with tempfile.TemporaryDirectory(prefix="aisio-dsort-") as tmp:
            spec_path = Path(tmp, "spec.json")
            spec_path.write_text(json.dumps(spec))
            job_id = job.start(spec_path)

    deadline = time.monotonic() + timeout
    unknown_since = None
    while True:
        infos = _job_infos(job, job_id, where, cluster)
        if infos is None:  # every target answered "does not exist"
            unknown_since = unknown_since or time.monotonic()
            if time.monotonic() - unknown_since > UNKNOWN_GRACE_S:
                raise DsortError(
                    f"dSort job {job_id} ({input_url} -> {output_url}) started, but every target of the "
                    f"cluster at {cluster} has answered for {UNKNOWN_GRACE_S:.0f} s that it does not know "
                    f"the job (a target restarted, or the cluster map changed under it)"
                )
            time.sleep(poll_s)
            continue
        unknown_since = None
        errors = [e for info in infos for e in (info.metrics.errors or []) if e]
        if any(info.aborted or info.metrics.aborted for info in infos):
            raise DsortError(f"dSort job {job_id} ({input_url} -> {output_url}) aborted: {'; '.join(errors) or 'no reason given'}")
        if infos and all(info.metrics.shard_creation.finished for info in infos):
            if errors:
                raise DsortError(f"dSort job {job_id} ({input_url} -> {output_url}) failed: {'; '.join(errors)}")
            break
        if time.monotonic() > deadline:
            try:
                job.abort()
            except AIS_FAILURES:
                pass  # the timeout is the error to report
            raise DsortError(f"dSort job {job_id} ({input_url} -> {output_url}) did not finish in {timeout:.0f} s; aborted")
        time.sleep(poll_s)
    return [f"ais://{out_bucket}/{name}" for name in _output_names(out_bucket, out_template)]


def _job_infos(job, job_id: str, where: AISUrl, cluster: str) -> list | None:
    """Each target's record of the job; ``None`` when the cluster answers that no target has one."""
    with translating(DsortError, where, cluster, doing=f"follow dSort job {job_id}"):
        try:
            return list((job.get_job_info() or {}).values())
        except AIS_FAILURES as exn:
            if status_of(exn) == 404 and "does not exist" in server_message(exn):
                return None
            raise


def _wait_gone(bucket: str, template: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _output_names(bucket, template):
        if time.monotonic() > deadline:
            raise DsortError(f"old outputs in ais://{bucket} matching {template!r} were not deleted in {timeout:.0f} s")
        time.sleep(0.2)
