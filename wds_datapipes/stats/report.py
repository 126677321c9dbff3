"""From a snapshot to what limits the run and the setting that would move it: pure rules, then text.

The rules, in order (each constant is named below):

1. **Is data the limit?** From the training loop's wait (``watch``): when it waited for at
   least ``DATA_LIMIT_SHARE`` of its time, data limits; below, the training step does, and
   the report says data is *not* the limit. Without a watched loop it cannot tell, and says so.
2. **Which stage?** The stage of the data path with the most time in the processes that ran
   the pipes (Grain orders its stages by the same share); ``handover`` instead where data
   limits while those processes sat in it (handing batches over, or idle) for at least
   ``HANDOVER_SHARE`` of their time: the pipes keep up, the way to the trainer does not.
3. **Which setting?** By stage: reading (``list``, ``open``, ``read``): a source whose read rate
   is ``SLOW_SOURCE_RATIO`` times below another's is named; else small shards whose opening
   outweighs their reading (``shard_size``); else remote shards without the shard cache
   (``cache``); else more readers (``workers``). Decoding without threads:
   ``decode_threads``; the user's per-sample code (``transform``, ``other``): ``transform``;
   the rest: ``workers``. A straggler rank of the last gather is named too.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .snapshot import Snapshot, SourceStats
from .tallies import ALL_STAGES, STAGES

DATA_LIMIT_SHARE = 0.10
HANDOVER_SHARE = 0.5
SLOW_SOURCE_RATIO = 3.0
SMALL_SHARD_BYTES = 64 << 20
PATH = STAGES + ("other",)  # the data path's stages (handover is what is left of the wall clock)
READING = ("list", "open", "read")


@dataclass(frozen=True)
class Diagnosis:
    """What limits the run, from a snapshot's numbers (:func:`diagnose`).

    Attributes:
        data_limits: True: the loop waits on data; False: it does not (the step limits);
            None: no loop was watched.
        stage: the limiting stage of the data path (its busiest stage where data does not limit).
        setting: what would move it: ``workers``, ``decode_threads``, ``cache``, ``shard_size``,
            ``source`` (a slow source, named in ``source``), ``index`` (listing), ``transform``,
            ``handover``; None where data does not limit or nothing was measured.
        source: the source that takes the most time reading (named where reading limits).
        straggler: the straggler rank of the last gather, or None.
        shares: each stage's share of the time of the processes that ran the pipes.
        wait_share: the loop's, where watched.
        readiness: the loop's, where watched.
    """

    data_limits: bool | None
    stage: str | None
    setting: str | None
    source: str | None = None
    straggler: int | None = None
    shares: dict[str, float] = field(default_factory=dict)
    wait_share: float | None = None
    readiness: float | None = None


def diagnose(snapshot: Snapshot) -> Diagnosis:
    """The limiting stage and the setting that would move it (pure; see the module's rules)."""
    total = sum(s.seconds for s in snapshot.stages.values())
    shares = {name: (snapshot.stages[name].seconds / total if total else 0.0) for name in ALL_STAGES
              if name in snapshot.stages}
    wait = snapshot.wait if snapshot.wait is not None and snapshot.wait.steps else None
    data_limits = None if wait is None else wait.wait_share >= DATA_LIMIT_SHARE
    straggler = snapshot.ranks.straggler if snapshot.ranks is not None else None
    busy = {name: shares.get(name, 0.0) for name in PATH}
    stage = max(busy, key=busy.get) if any(busy.values()) else None
    if data_limits and shares.get("handover", 0.0) >= HANDOVER_SHARE:
        stage = "handover"
    source = _slowest(snapshot) if stage in READING else None
    setting = _setting(snapshot, stage, source) if data_limits is not False and stage is not None else None
    return Diagnosis(data_limits, stage, setting, source, straggler, shares,
                     None if wait is None else wait.wait_share, None if wait is None else wait.readiness)


def _slowest(snapshot: Snapshot) -> str | None:
    sources = [s for s in snapshot.sources.values() if s.read_seconds + s.open_seconds > 0]
    return max(sources, key=lambda s: s.read_seconds + s.open_seconds).name if sources else None


def _setting(snapshot: Snapshot, stage: str, source: str | None) -> str:
    if stage in READING:
        if stage == "list":
            return "index"
        slow = snapshot.sources.get(source) if source else None
        others = [s.read_rate for s in snapshot.sources.values() if s.name != source and s.read_rate > 0]
        if slow is not None and others and slow.read_rate * SLOW_SOURCE_RATIO < max(others):
            return "source"
        opening, reading = snapshot.stages["open"], snapshot.stages["read"]
        if opening.items and opening.seconds > reading.seconds and reading.bytes / opening.items < SMALL_SHARD_BYTES:
            return "shard_size"
        remote = any(name not in ("file", "list") for name in snapshot.schemes)
        cache = snapshot.cache.get("hits", 0) + snapshot.cache.get("misses", 0) + snapshot.cache.get("read_along", 0)
        return "cache" if remote and not cache else "workers"
    if stage == "decode":
        return "decode_threads" if snapshot.stages["decode"].threads == 0 else "workers"
    if stage in ("transform", "other"):
        return "transform"
    if stage == "handover":
        return "handover"
    return "workers"


# ---------------------------------------------------------------- the text

_STAGE_WORDS = {
    "list": "listing shards", "open": "opening shards", "read": "reading shards",
    "tar": "tar parsing and grouping", "decode": "decoding", "transform": "your per-sample transforms",
    "batch": "batching and collation", "other": "code between our pipes that we do not see (your .map)",
    "handover": "handing batches to the training loop",
}


def report(snapshot: Snapshot) -> str:
    """A short text: whether data limits, the limiting stage and the setting that would move it,
    then the numbers behind it (stages, sources, mixtures, ranks)."""
    if not snapshot.enabled:
        return "stats are off: call wd.stats.enable() before building the pipeline"
    d = diagnose(snapshot)
    lines = [_verdict(snapshot, d)]
    if d.stage is not None:
        lines.append(f"limiting stage: {d.stage} ({_STAGE_WORDS[d.stage]}), {d.shares.get(d.stage, 0):.0%} of the "
                     f"pipes' time in {_workers(snapshot)}")
        advice = _advice(snapshot, d)
        if advice:
            lines.append(f"setting: {advice}")
    elif not snapshot.processes or not any(s.seconds for s in snapshot.stages.values()):
        lines.append("no pipe measured anything: were the pipes built after wd.stats.enable()?")
    if d.straggler is not None:
        r = next(r for r in snapshot.ranks.ranks if r.rank == d.straggler)
        lines.append(f"straggler: rank {d.straggler} waits {r.stall_per_batch * 1e3:.1f} ms a batch for data "
                     f"(median of the ranks {snapshot.ranks.stall_median * 1e3:.1f} ms)")
    lines.append("stages: " + ", ".join(f"{name} {share:.0%}" for name, share in
                                         sorted(d.shares.items(), key=lambda kv: -kv[1]) if share >= 0.005))
    for s in snapshot.sources.values():
        if s.samples or s.objects or s.bytes:
            lines.append("source " + _source_line(s))
    for m in snapshot.mixtures:
        lines.append(f"mixture {m.mixer} epoch {m.epoch}: {m.source} {m.samples} samples, {m.realized:.3f} of the "
                     f"epoch so far (target {m.target:.3f})")
    if snapshot.ranks is not None:
        k = snapshot.ranks
        lines.append(f"ranks: wait a batch min/median/max {k.stall_min * 1e3:.1f}/{k.stall_median * 1e3:.1f}/"
                     f"{k.stall_max * 1e3:.1f} ms; batches/s {k.throughput_min:.1f}/{k.throughput_median:.1f}/"
                     f"{k.throughput_max:.1f}")
    return "\n".join(lines)


def _verdict(snapshot: Snapshot, d: Diagnosis) -> str:
    wait = snapshot.wait
    if d.data_limits is None:
        return "no training loop was watched (wd.stats.watch(loader)): whether data limits is not known"
    numbers = (f"waited {d.wait_share:.0%} of its time, {wait.stall_per_batch * 1e3:.1f} ms a batch; "
               f"readiness {d.readiness:.0%}")
    if d.data_limits:
        return f"data is the limit: the training loop {numbers}"
    step = wait.step_seconds / wait.steps * 1e3 if wait.steps else 0.0
    return f"data is NOT the limit: the training step is ({step:.1f} ms a step); the loop {numbers}"


def _workers(snapshot: Snapshot) -> str:
    loaders = [w for w in snapshot.workers if w.worker != -1]
    if not loaders:
        return f"the training process (no loader workers), {snapshot.cpus} CPUs"
    count = len({(w.rank, w.worker, w.pids if w.worker == -2 else ()) for w in loaders})
    return f"{count} loader worker{'s' if count != 1 else ''}, {snapshot.cpus} CPUs"


def _advice(snapshot: Snapshot, d: Diagnosis) -> str:
    if d.data_limits is False:
        return ""
    source = snapshot.sources.get(d.source) if d.source else None
    words = {
        "source": (f"source {d.source!r} is slow ({_rate(source)}): give it fewer samples, a faster store, or "
                   "cache it (wd.set_cache)") if source else "",
        "shard_size": "bigger shards: opening takes longer than reading them",
        "cache": "the shard cache (wd.set_cache(dir, limit)): later epochs read local copies",
        "index": "a shard index (ExactEpochs): no listing while training",
        "decode_threads": "decode threads (decode(..., num_threads=N) or decode_batches(..., num_threads=N)), "
                          "or more workers",
        "transform": "more workers, or a lighter transform (batched, or on the GPU)",
        "handover": "the hand-over: fewer bytes a batch (crops, uint8), pin_memory, more prefetch_factor",
        "workers": f"more workers (num_workers; {_workers(snapshot)})",
    }
    return words.get(d.setting, "")


def _rate(s: SourceStats) -> str:
    return f"{s.read_rate / 1e6:.2f} MB/s" if s.read_rate else "no read timed"


def _source_line(s: SourceStats) -> str:
    parts = [repr(s.name), f"{s.samples} samples", f"{s.objects} shards", f"{s.bytes / 1e6:.1f} MB", _rate(s)]
    if s.retries or s.errors:
        parts.append(f"{s.retries} retries, {s.errors} errors")
    if s.cache_hits or s.cache_misses:
        parts.append(f"cache {s.cache_hits} hits, {s.cache_misses} misses")
    return ", ".join(parts)
