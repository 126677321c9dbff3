"""Per-field helpers for sample dicts: ``to_tuple``, ``rename_keys``, ``map_fields``."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ..errors import SampleError
from ..handlers import Handler, reraise_exception, skips
from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..torch_datapipes import IterDataPipe, functional_datapipe


def pick_field(sample: dict, alternatives: str) -> Any:
    """The first of ``"jpg;png"``'s fields present in ``sample``; KeyError names them all."""
    for name in alternatives.split(";"):
        if name in sample:
            return sample[name]
    raise KeyError(f"none of the fields {alternatives!r} (sample has {sorted(sample)})")


def _present(sample: dict, alternatives: str) -> Any:
    """``pick_field``, where a field holding None counts as missing too (webdataset's to_tuple)."""
    value = pick_field(sample, alternatives)
    if value is None:
        raise KeyError(f"the field of {alternatives!r} holds None")
    return value


class _PerSample(Pipe):
    """Applies ``self._convert`` to each sample; a failure goes to the handler, which may skip it."""

    source_datapipe: IterDataPipe
    handler: Handler
    _stats = None  # stats on or off, taken when the pipe is built (``_took_stats``); None: off

    def _took_stats(self) -> None:
        self._stats = current_settings()

    def _convert(self, sample: dict) -> Any:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        probe = stats_probe(self._stats)
        sampler = probe.sampler("transform") if probe is not None else None
        due = sampler.due if sampler is not None else 0  # 0: off (see stats.probe.Sampler)
        try:
            for sample in self.source_datapipe:
                t0 = 0
                if due:
                    due -= 1
                    if not due:
                        t0 = sampler.start()
                try:
                    converted = self._convert(sample)
                except SampleError as exn:
                    if sampler is not None:
                        sampler.stage.errors += 1
                    if not skips(self.handler, exn, sample):
                        raise
                    continue
                except Exception as exn:  # a user function may raise anything: name the sample
                    if sampler is not None:
                        sampler.stage.errors += 1
                    error = SampleError(sample.get("__url__", "?"), sample.get("__key__", "?"),
                                        f"{type(self).__name__}: {type(exn).__name__}: {exn}")
                    error.__cause__ = exn  # set before the handler, which may raise it
                    if not skips(self.handler, error, sample):
                        raise error from exn
                    continue
                finally:
                    if t0:
                        due = sampler.stop(t0)
                yield converted
        finally:
            if sampler is not None:
                sampler.save(due)
                probe.ended()


@functional_datapipe("to_tuple")
class TupleMaker(_PerSample):
    """Yields a tuple of chosen fields of each sample (functional name: ``to_tuple``).

    Each name may list alternatives with ``;``: ``to_tuple("jpg;png", "cls")``. As in
    webdataset, one string with spaces names several fields: ``to_tuple("jpg;png cls")``.
    A sample missing a field (or holding None in it) is an error given to ``handler``
    (skip it with ``warn_and_continue``).
    """

    def __init__(self, source_datapipe: IterDataPipe[dict], *fields: str, handler: Handler = reraise_exception):
        if len(fields) == 1 and isinstance(fields[0], str) and " " in fields[0]:
            fields = tuple(fields[0].split())
        if not fields:
            raise ValueError("to_tuple needs at least one field name")
        self.source_datapipe = source_datapipe
        self.fields = fields
        self.handler = handler
        self._took_stats()

    def _convert(self, sample: dict) -> tuple:
        return tuple(_present(sample, f) for f in self.fields)


@functional_datapipe("rename_keys")
class KeyRenamer(_PerSample):
    """Yields each sample with fields renamed, ``{new: "old;alternative"}`` (functional name: ``rename_keys``).

    Renames come as a dict (``rename_keys({"image": "jpg;png", "cls": "label"})``: field
    names such as ``cls``, ``keep`` or ``handler`` cannot be keywords here) or as keywords.
    With ``keep=False`` only the renamed fields and ``__key__``/``__url__`` remain.
    """

    def __init__(self, source_datapipe: IterDataPipe[dict], renames: Mapping[str, str] | None = None,
                 keep: bool = True, handler: Handler = reraise_exception, **more_renames: str):
        self.source_datapipe = source_datapipe
        self.renames = {**(renames or {}), **more_renames}
        self.keep = keep
        self.handler = handler
        self._took_stats()

    def _convert(self, sample: dict) -> dict:
        renamed = {new: pick_field(sample, old) for new, old in self.renames.items()}
        if self.keep:
            used = {name for old in self.renames.values() for name in old.split(";")}
            out = {k: v for k, v in sample.items() if k not in used}
        else:
            out = {k: sample[k] for k in ("__key__", "__url__") if k in sample}
        out.update(renamed)
        return out


@functional_datapipe("map_fields")
class FieldMapper(_PerSample):
    """Yields each sample with a function applied to each named field (functional name: ``map_fields``).

    Functions come as a dict (``map_fields({"cls": int, "jpg": fn})``: ``cls`` cannot be a
    keyword of a torch functional form) or as keywords (``map_fields(jpg=fn)``). A missing
    field or a failing function is an error given to ``handler``.
    """

    def __init__(self, source_datapipe: IterDataPipe[dict], functions: Mapping[str, Callable[[Any], Any]] | None = None,
                 handler: Handler = reraise_exception, **more_functions: Callable[[Any], Any]):
        self.source_datapipe = source_datapipe
        self.functions = {**(functions or {}), **more_functions}
        self.handler = handler
        self._took_stats()

    def _convert(self, sample: dict) -> dict:
        out = dict(sample)
        for name, fn in self.functions.items():
            out[name] = fn(pick_field(sample, name))
        return out
