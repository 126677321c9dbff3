"""Parts 2 and 3 of bench_storage.py: whole pipelines over s3://, http://, ais:// and
webdataset's ``pipe:``, ExactEpochs by places, the cache over s3://, and the time to the
first sample of a 10,000-object bucket listed by glob. See bench_storage.py's docstring."""

from __future__ import annotations

import io
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import webdataset as wds
from bench_ais import Loader, Row
from bench_storage import alternating

import wds_datapipes as wd
from aisio import get_client

NO_S3 = ""  # why s3:// rows are missing, or "" where a back end for s3:// is registered
LISTED_BUCKET = "bench-storage-listed"
LISTED_OBJECTS = 10_000
PER_ROUND = 3  # epochs a round in the pipelines' table: an epoch of the 64 MB set is about 0.4 s for ours
SLOW_PER_ROUND = 1  # for pipe:aws (8-80x slower: one epoch is seconds)


def s3_environment(endpoint: str) -> None:
    """The standard AWS variables for AIStore's /s3 (auth off: any key), which our s3://
    back end, boto3 and the AWS CLI all read; DataLoader workers inherit them."""
    config = os.path.join(tempfile.mkdtemp(prefix="bench-storage-aws-"), "config")
    with open(config, "w") as f:  # the AWS CLI: path style (no bucket.host names on 127.0.0.1)
        f.write("[default]\nregion = us-east-1\ns3 =\n    addressing_style = path\n")
    os.environ.update(AWS_ENDPOINT_URL=f"{endpoint}/s3", AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench-secret",
                      AWS_REGION="us-east-1", AWS_DEFAULT_REGION="us-east-1", AWS_ALLOW_HTTP="true",
                      AWS_VIRTUAL_HOSTED_STYLE_REQUEST="false", AWS_CONFIG_FILE=config)


def s3_missing() -> str:
    """Why our s3:// rows cannot run here, or "" where they can."""
    from wds_datapipes.shards.openers import backend_for, register_backend

    try:
        backend_for("s3://bucket/key.tar")
        return ""
    except wd.ShardOpenError:  # no s3 entry point: an editable install older than the back end?
        pass
    try:
        from wds_datapipes.storage.object_store import S3

        register_backend(S3)  # forked DataLoader workers inherit the registry
        backend_for("s3://bucket/key.tar")
    except Exception as exn:  # noqa: BLE001 - any failure means: no back end
        return f"back end not available ({type(exn).__name__}: {str(exn)[:100]})"
    return ""


def urls_by_scheme(endpoint: str, bucket: str, names: list[str]) -> dict[str, list[str]]:
    urls = {"http": [f"{endpoint}/s3/{bucket}/{n}" for n in names], "ais": [f"ais://{bucket}/{n}" for n in names]}
    if not NO_S3:
        urls["s3"] = [f"s3://{bucket}/{n}" for n in names]
    return urls


def _median_rate(row: Row) -> float:
    return row.nbytes * row.epochs_per_pass / statistics.median(row.seconds) / 1e6


def bench_pipelines(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int, data: str) -> None:
    global NO_S3
    s3_environment(endpoint)
    NO_S3 = s3_missing()
    beside = os.path.join(os.path.dirname(sys.executable), "aws")  # the bench venv's, before any on PATH
    aws = beside if os.path.exists(beside) else shutil.which("aws")
    print("\n2. Pipelines: load_tar().group_by_key(), raw (no decoding), DataLoader with 2 workers, "
          f"{PER_ROUND} epochs a round ({SLOW_PER_ROUND} for pipe:aws), each side's samples tallied by one plain "
          f"generator in its workers (MB/s of the median of {rounds} rounds, alternating)")
    if NO_S3:
        print(f"   s3:// rows: {NO_S3}")
    if not aws:
        print("   webdataset over `aws s3 cp`: no `aws` on PATH (pip install awscli)")
    table: dict[str, dict[str, float]] = {}
    paired: dict[str, str] = {}
    for label in ("2-4 MB", "64 MB"):
        urls = urls_by_scheme(endpoint, bucket, sets[label])
        rows = [Row(f"ours, {scheme}://", Loader("datapipes", lambda u=u: wd.ShardLister(u).load_tar().group_by_key(),
                                                  generator_tally=True))
                for scheme, u in urls.items()]
        curl = [f"pipe:curl -s -f {u}" for u in urls["http"]]
        rows.append(Row("webdataset, pipe:curl", Loader("webdataset", lambda curl=curl: wds.WebDataset(
            curl, shardshuffle=False, empty_check=False), generator_tally=True)))
        if aws:
            cp = [f"pipe:{aws} s3 cp --only-show-errors s3://{bucket}/{n} -" for n in sets[label]]
            rows.append(Row("webdataset, pipe:aws s3 cp", Loader("webdataset", lambda cp=cp: wds.WebDataset(
                cp, shardshuffle=False, empty_check=False), generator_tally=True)))
        _measure(rows, rounds, {"webdataset, pipe:aws s3 cp": SLOW_PER_ROUND}, PER_ROUND)
        paired[label] = _paired(rows, "ours, s3://", "webdataset, pipe:curl")
        table[label] = {row.name: _median_rate(row) for row in rows}
        counts = {(row.samples, row.nbytes) for row in rows}
        if len(counts) > 1:
            print(f"   WARNING: the rows read different samples/bytes on {label}: {sorted(counts)}")
    names = list(table["2-4 MB"])
    print("\n| reader | MB/s, 2-4 MB shards | MB/s, 64 MB shards |")
    print("|---|---:|---:|")
    for name in names:
        print(f"| {name} | {table['2-4 MB'][name]:,.0f} | {table['64 MB'][name]:,.0f} |")
    _ratios(table)
    print("  ours, s3:// / webdataset, pipe:curl, each round's pair: median (range) "
          + "; ".join(f"{label} {text}" for label, text in paired.items()))
    forked_after_obstore(endpoint, bucket, sets, rounds)  # first: its in-process row needs a parent without obstore
    exact_epochs(endpoint, bucket, sets, rounds)
    cache_over_s3(endpoint, bucket, sets, rounds)


def bench_forked(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """Only the rows of workers forked after the parent used obstore (``--only-forked``)."""
    global NO_S3
    s3_environment(endpoint)
    NO_S3 = s3_missing()
    forked_after_obstore(endpoint, bucket, sets, rounds)


def forked_after_obstore(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """s3:// in DataLoader workers forked after this process used obstore (obstore's runtime
    does not survive a fork): by presigned URLs (the agent signs, the bytes come straight
    from the server) and with the agent relaying every byte, against workers forked before
    the parent used obstore (in-process obstore) and http:// on the same 2-4 MB shards.
    CPU: the workers' and their agents' (every process below this one but the cluster's)."""
    from wds_datapipes.storage import object_store, store_calls

    print("\ns3:// in workers forked after the parent used obstore, 2-4 MB shards, 2 workers "
          f"(median of {rounds} rounds, alternating)")
    if NO_S3:
        print(f"   not measured: s3:// {NO_S3}")
        return
    urls = urls_by_scheme(endpoint, bucket, sets["2-4 MB"])

    def row(name: str, scheme: str) -> Row:
        return Row(name, Loader("datapipes", lambda u=urls[scheme]: wd.ShardLister(u).load_tar().group_by_key()))

    rows = []
    if store_calls._runtime_pid is None:  # workers forked now make their calls in-process
        rows.append(row("s3://, in-process obstore (forked before)", "s3"))
        _start(rows[-1])
    else:
        print("   (no in-process row: this process used obstore before)")
    object_store.S3.stamp(urls["s3"][0])  # obstore used here: the workers below are forked after it
    for presigned, name in ((False, "s3://, the agent relays the bytes"), (True, "s3://, presigned URLs")):
        object_store.PRESIGNED_READS = presigned  # the workers forked now keep it
        rows.append(row(name, "s3"))
        _start(rows[-1])
    object_store.PRESIGNED_READS = True
    rows.append(row("http://", "http"))
    _start(rows[-1])
    cpu = {r.name: 0.0 for r in rows}
    try:
        for _, r in alternating(rounds, rows):
            before = _below_ms()
            r.measure(1, [])
            cpu[r.name] += _below_ms() - before
    finally:
        for r in rows:
            r.loader.stop()
    base = _median_rate(rows[0])
    print("\n| workers' reader | MB/s | vs the first row | CPU ms per MB (workers + agents) |")
    print("|---|---:|---:|---:|")
    for r in rows:
        mb = r.nbytes * len(r.seconds) / 1e6
        print(f"| {r.name} | {_median_rate(r):,.0f} | {_median_rate(r) / base:.2f} | {cpu[r.name] / mb:.2f} |")


def bench_bulk_reads(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """``--only-bulk-reads``: s3:// with presigned bodies read in bulk (each read waiting for up to
    ``signed_get.RECEIVE_LOW_WATER`` bytes) and one recv() at a time, against http:// and
    webdataset's ``pipe:curl``, on both shard sizes: MB/s of the median round, the paired
    ratio of each round, and CPU ms per MB of the workers, the main process and the cluster."""
    from aisio.cluster import LocalCluster
    from wds_datapipes.storage import signed_get

    global NO_S3
    s3_environment(endpoint)
    NO_S3 = s3_missing()
    if NO_S3:
        print(f"\nbulk reads: not measured: s3:// {NO_S3}")
        return
    cluster = LocalCluster.running()
    nodes = [n.pid for n in cluster.nodes] if cluster is not None and cluster.endpoint == endpoint else []
    bulk = signed_get.RECEIVE_LOW_WATER
    print(f"\ns3:// bodies read in bulk or one recv() at a time, 2 workers (median of {rounds} rounds, alternating)")
    for label in ("2-4 MB", "64 MB"):
        urls = urls_by_scheme(endpoint, bucket, sets[label])
        rows = []
        for name, scheme, low_water in (("s3://, bulk", "s3", bulk), ("s3://, a recv() at a time", "s3", 0),
                                        ("http://", "http", bulk)):
            signed_get.RECEIVE_LOW_WATER = low_water  # the workers forked now keep it
            rows.append(Row(name, Loader("datapipes", lambda u=urls[scheme]: wd.ShardLister(u).load_tar().group_by_key())))
            _start(rows[-1])
        signed_get.RECEIVE_LOW_WATER = bulk
        curl = [f"pipe:curl -s -f {u}" for u in urls["http"]]
        rows.append(Row("webdataset, pipe:curl", Loader("webdataset", lambda curl=curl: wds.WebDataset(
            curl, shardshuffle=False, empty_check=False))))
        _start(rows[-1])
        try:
            for _, r in alternating(rounds, rows):
                r.measure(1, nodes)
        finally:
            for r in rows:
                r.loader.stop()
        mb = rows[0].nbytes / 1e6
        print(f"\n{label} shards\n\n| reader | MB/s | vs s3://, bulk (paired) | CPU ms/MB: workers | main | cluster |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            paired = statistics.median(a / b for a, b in zip(rows[0].seconds, r.seconds))
            cpu = {k: v / mb / len(r.seconds) for k, v in r.cpu_ms.items()}
            print(f"| {r.name} | {_median_rate(r):,.0f} | {paired:.2f} | {cpu['workers']:.2f} | {cpu['main']:.2f} "
                  f"| {cpu['cluster']:.2f} |")


def _start(row: Row) -> None:
    row.loader.start()
    row.loader.epoch()


def _below_ms() -> float:
    """CPU ms (user + system) of the processes below this one (workers, their agents), not the
    cluster's nodes (started detached)."""
    parents, ticks = {}, {}
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[pid], ticks[pid] = fields[1], int(fields[11]) + int(fields[12])
    me, total = str(os.getpid()), 0
    for pid, used in ticks.items():
        up = parents.get(pid)
        while up and up != me and up != "0":
            up = parents.get(up)
        if up == me:
            total += used
    return total * 1000 / os.sysconf("SC_CLK_TCK")


def _measure(rows: list[Row], rounds: int, per_round: dict[str, int] | None = None, default: int = 1) -> None:
    """Rounds of every row in turn (the order reversed every other round), each row ``default``
    epochs a round or its own number in ``per_round``."""
    for row in rows:  # all loaders up, each warmed once
        row.loader.start()
        row.loader.epoch()
    try:
        for _, row in alternating(rounds, rows):
            row.measure((per_round or {}).get(row.name, default), [])
    finally:
        for row in rows:
            row.loader.stop()


def _paired(rows: list[Row], a: str, b: str) -> str:
    """The median and range of the rate ratio of rows ``a`` and ``b`` within each round."""
    named = {row.name: row for row in rows}
    if a not in named or b not in named:
        return "(not measured)"
    one, other = named[a], named[b]
    return _spread([(one.epochs_per_pass / ta) / (other.epochs_per_pass / tb)
                    for ta, tb in zip(one.seconds, other.seconds)])


def _spread(ratios: list[float]) -> str:
    """Each round's ratio, summed up: its median and (range)."""
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"


def _ratios(table: dict[str, dict[str, float]]) -> None:
    print("\nratios (median rounds)                  2-4 MB   64 MB   target")
    pairs = [("ours, s3:// / ours, http://", "ours, s3://", "ours, http://", ">= 0.9"),
             ("ours, s3:// / ours, ais://", "ours, s3://", "ours, ais://", ""),
             ("ours, http:// (/s3) / ours, ais://", "ours, http://", "ours, ais://", ""),
             ("ours, s3:// / webdataset, pipe:curl", "ours, s3://", "webdataset, pipe:curl", ">= 3"),
             ("ours, s3:// / webdataset, pipe:aws", "ours, s3://", "webdataset, pipe:aws s3 cp", ">= 3"),
             ("ours, http:// / webdataset, pipe:curl", "ours, http://", "webdataset, pipe:curl", "")]
    for label, a, b, target in pairs:
        if a in table["2-4 MB"] and b in table["2-4 MB"]:
            cells = "".join(f"{table[s][a] / table[s][b]:8.2f}" for s in ("2-4 MB", "64 MB"))
            print(f"  {label:38}{cells}   {target}")
        else:
            print(f"  {label:38}   (not measured: {'s3:// back end not available' if NO_S3 else 'a row is missing'})")


def place_indexes(work: str, label: str, urls_by_reader: dict[str, list[str]]) -> dict[str, str]:
    """{reader: the path of an index with member places of its URLs}, saved under ``work``."""
    indexes = {}
    for reader, urls in urls_by_reader.items():
        path = os.path.join(work, f"{reader.replace('/', '_')}-{label.replace(' ', '')}.json")
        wd.ShardIndex.from_scans(wd.build_index(urls, places=True)).save(path)
        indexes[reader] = path
    return indexes


def exact_epochs(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """ExactEpochs (shuffled, one process) by an index with member places: samples/s of an
    epoch, and the time to the first batch of a state resumed at 50% of the epoch."""
    print(f"\nExactEpochs by an index with --places, shuffled (spans start mid-shard), one process, "
          f"{PER_ROUND} epochs a round (median of {rounds} rounds, alternating)\n")
    print("| shards | reader | samples/s, an epoch | MB/s | first batch resumed at 50% (ms) |")
    print("|---|---|---:|---:|---:|")
    work = tempfile.mkdtemp(prefix="bench-storage-index-")
    try:
        for label in ("2-4 MB", "64 MB"):
            indexes = place_indexes(work, label, urls_by_scheme(endpoint, bucket, sets[label]))
            epoch_s: dict[str, list[float]] = {}
            resume_s: dict[str, list[float]] = {}
            counted: dict[str, tuple[int, int]] = {}
            for _, scheme in alternating(rounds, list(indexes)):
                pipe = wd.ExactEpochs(indexes[scheme], batch_size=8, seed=1)
                began = time.perf_counter()
                for _ in range(PER_ROUND):  # epochs 0, 1, 2: the same samples, each epoch's own order
                    count, nbytes = 0, 0
                    for sample in pipe:
                        count += 1
                        nbytes += sum(len(v) for k, v in sample.items() if not k.startswith("__"))
                epoch_s.setdefault(scheme, []).append((time.perf_counter() - began) / PER_ROUND)
                counted[scheme] = (count, nbytes)
                state = wd.EpochState(epoch=0, batches=pipe.batches_per_epoch // 2)
                began = time.perf_counter()
                resumed = wd.ExactEpochs(indexes[scheme], batch_size=8, seed=1).batch_samples(8)
                resumed.load_state_dict(state)
                next(iter(resumed))
                resume_s.setdefault(scheme, []).append(time.perf_counter() - began)
            for scheme in indexes:
                seconds = statistics.median(epoch_s[scheme])
                count, nbytes = counted[scheme]
                print(f"| {label} | ours, {scheme}:// | {count / seconds:,.0f} | {nbytes / seconds / 1e6:,.0f} "
                      f"| {statistics.median(resume_s[scheme]) * 1000:,.0f} |")
            if "s3" in indexes:
                pairs = _spread([h / s for h, s in zip(epoch_s["http"], epoch_s["s3"])])
                print(f"|  | s3:// / http:// | {statistics.median(epoch_s['http']) / statistics.median(epoch_s['s3']):.2f}"
                      f" (target >= 0.9; each round's pair {pairs}) | | |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cache_over_s3(endpoint: str, bucket: str, sets: dict[str, list[str]], rounds: int) -> None:
    """Epoch 1 and 2 with the cache over s3:// (2-4 MB shards, one process): epoch 2 reads
    the local copies (each opening revalidated by the object's size and version)."""
    print("\nThe cache over s3:// (2-4 MB shards, one process, load_tar().group_by_key())")
    if NO_S3:
        print(f"   not measured: s3:// {NO_S3}")
        return
    urls = urls_by_scheme(endpoint, bucket, sets["2-4 MB"])["s3"]
    total = 0
    results: dict[str, list[float]] = {}
    for r in range(rounds):
        folder = tempfile.mkdtemp(prefix="bench-storage-cache-")
        try:
            for label, cache in (("no cache", None), ("cache", folder)):
                wd.set_cache(cache, "100GB" if cache else 0)
                for e in (1, 2):
                    began = time.perf_counter()
                    total = sum(sum(len(v) for k, v in s.items() if not k.startswith("__"))
                                for s in wd.ShardLister(urls).load_tar().group_by_key())
                    results.setdefault(f"{label}, epoch {e}", []).append(time.perf_counter() - began)
        finally:
            wd.set_cache(None)
            shutil.rmtree(folder, ignore_errors=True)
    base = statistics.median(results["no cache, epoch 1"])
    for label, seconds in results.items():
        median = statistics.median(seconds)
        print(f"   {label:<22} {total / median / 1e6:7,.0f} MB/s   {base / median:5.2f}x no cache, epoch 1")


def _tiny_shard(i: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        data = f"{i}".encode()
        info = tarfile.TarInfo(f"s{i:06d}.cls")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def bench_listing(endpoint: str, rounds: int) -> None:
    """Time to the first sample of a bucket of 10,000 one-sample shards listed by glob, and
    the time to list it all, for s3:// (ShardLister's glob) and ais:// (AISSourceLister)."""
    global NO_S3
    s3_environment(endpoint)
    NO_S3 = s3_missing()
    from aisio import AISSourceLister

    bucket = get_client().bucket(LISTED_BUCKET)
    bucket.delete(missing_ok=True)
    bucket.create()
    began = time.perf_counter()
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: bucket.object(f"train/shard-{i:06d}.tar").get_writer().put_content(_tiny_shard(i)),
                      range(LISTED_OBJECTS)))
    print(f"\n3. Time to the first sample of a bucket of {LISTED_OBJECTS:,} objects listed by glob "
          f"(put in {time.perf_counter() - began:.0f} s; median of {rounds} rounds, alternating)\n")
    makers: dict[str, Callable[[], object]] = {
        "ours, ais:// (AISSourceLister, glob)": lambda: AISSourceLister(f"ais://{LISTED_BUCKET}/train/*.tar"),
    }
    if not NO_S3:
        makers["ours, s3:// (ShardLister, glob)"] = lambda: wd.ShardLister(f"s3://{LISTED_BUCKET}/train/*.tar")
    first: dict[str, list[float]] = {}
    whole: dict[str, list[float]] = {}
    failed: dict[str, str] = {}
    for _, name in alternating(rounds, list(makers)):
        if name in failed:
            continue
        began = time.perf_counter()
        try:
            next(iter(makers[name]().load_tar().group_by_key()))
        except Exception as exn:  # noqa: BLE001 - a row that fails says why; the others go on
            failed[name] = f"{type(exn).__name__}: {str(exn)[:160]}"
            continue
        first.setdefault(name, []).append(time.perf_counter() - began)
        began = time.perf_counter()
        count = sum(1 for _ in makers[name]())
        whole.setdefault(name, []).append(time.perf_counter() - began)
        if count != LISTED_OBJECTS:
            print(f"   WARNING: {name} listed {count} objects, not {LISTED_OBJECTS}")
    print("| lister | first sample (ms) | the whole listing (ms) |")
    print("|---|---:|---:|")
    for name in makers:
        if name in failed:
            print(f"| {name} | failed: {failed[name]} | |")
            continue
        print(f"| {name} | {statistics.median(first[name]) * 1000:,.0f} | {statistics.median(whole[name]) * 1000:,.0f} |")
    if NO_S3:
        print(f"| ours, s3:// (ShardLister, glob) | {NO_S3} | |")
    bucket.delete(missing_ok=True)
