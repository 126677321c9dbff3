"""Decoding of sample fields (images, audio, video, text, numbers, JSON, arrays, tensors), by webdataset's rules.

A sample's fields hold raw bytes. A decoder turns each one into a value chosen by its
suffix: the user's handlers first, then the built-in ones, which pick a decoder by the
*last* dot-part of the suffix (``seg.png`` is an image, ``json.gz`` is gunzipped and then
parsed as JSON). A field no handler takes stays as it was. Values equal those of
webdataset 1.0.2's ``webdataset.autodecode.Decoder``; the few places where we differ on
purpose are listed in :class:`SampleDecoder`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..errors import DecodeError
from ..handlers import Handler, reraise_exception, skips
from ..limits import Limits, get_limits
from ..pipe_base import Pipe
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..threads import check_positive, ordered_map, worker_threads
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .images import check_image_formats, image_formats_for, register_image_plugins
from .media import AudioSpec, VideoSpec, media_handler
from .specs import Spec, compile_spec, split_names
from .values import SAFE_DECODERS, TRUSTING_DECODERS, gunzip


class SampleDecoder:
    """Decodes the fields of one sample dict; the logic of :class:`Decoder`, usable without a pipe.

    For each field, in order: ``.gz`` layers are gunzipped; then each spec is tried in the
    order given (an image spec name takes image suffixes; ``"audio"`` / ``"video"`` or an
    :class:`~wds_datapipes.decoding.media.AudioSpec` / ``VideoSpec`` take audio / video
    suffixes (see :mod:`~wds_datapipes.decoding.media`); a callable ``fn(".suffix", data)``
    takes the field when it returns something other than None, and gets the suffix with a
    leading dot, as webdataset's handlers do, so those work here unchanged; a dict
    ``{pattern: fn(data)}`` takes the field when a pattern matches its suffix, ``fnmatch``
    globs against the whole suffix, plain names against its last dot-parts); then the
    built-ins, chosen by the last dot-part of the suffix:

    - txt text transcript -> str; cls cls2 class count index inx id -> int
    - json jsn -> parsed JSON; mp msg msgpack -> msgpack; cbor -> cbor2
    - npy -> numpy array; npz -> dict of arrays; pth -> ``torch.load`` (CPU)
    - ten tb tenbin -> webdataset's tenbin; pyd pickle pkl -> pickle, only if allowed

    Anything else (audio and video too, unless a spec asks for them) stays as it was.
    Fields whose name starts with ``__`` and values that
    are not bytes-like (already decoded) pass through unchanged.

    Where we differ from webdataset 1.0.2 on purpose: ``class`` and ``count`` become int and
    ``msgpack``, ``tenbin`` are decoded (webdataset's writer writes them but its decoder
    leaves them as bytes); cbor uses ``cbor2`` (webdataset imports the long-dead ``cbor``);
    several ``.gz`` layers are all removed; ``.pth`` loads with ``weights_only=True`` unless
    allow_pickle; pickle is refused unless allow_pickle; non-bytes values pass through
    instead of failing; ``only`` also takes commas; a 16-bit greyscale image is made 8-bit
    by each value's high byte, as Pillow reads 16-bit colour (webdataset's Pillow convert
    clips it at 255; see ``decoding.images.eight_bits``).

    Args:
        *specs: image spec names, callables and dicts, tried in order before the built-ins.
        only: field names to decode (a list, or a string of names separated by spaces or
            commas); the other fields stay as they are. None decodes all.
        allow_pickle: trust the data: allow pickle, object arrays in npy/npz, and
            ``torch.load(weights_only=False)``.
        image_formats: None (default) opens each image field only as the format its suffix
            names (``.jpg`` as JPEG, ``.png`` as PNG; see ``decoding.image_formats_for``). A list
            of Pillow format names (``["JPEG", "PNG", "WEBP"]``) opens every image field as
            any of them, for data whose suffixes lie; formats that start another program
            (EPS) open only when named here.
        limits: the largest image (pixels), ``.gz`` field, npy/npz arrays, audio and video
            decoded (see :class:`~wds_datapipes.limits.Limits`); default:
            :func:`~wds_datapipes.limits.get_limits`.
    """

    def __init__(
        self,
        *specs: Spec | AudioSpec | VideoSpec,
        only: str | Iterable[str] | None = None,
        allow_pickle: bool = False,
        image_formats: Iterable[str] | None = None,
        limits: Limits | None = None,
    ):
        self.specs = specs
        self.handlers = [media_handler(spec) or compile_spec(spec) for spec in specs]
        self.only = split_names(only)
        self.allow_pickle = allow_pickle
        self.image_formats = None if image_formats is None else check_image_formats(image_formats)
        self.limits = limits or get_limits()
        register_image_plugins()  # here, not in each loader worker forked after this (~50 imports each)

    def formats_for(self, suffix: str) -> tuple[str, ...]:
        """The Pillow formats an image field with this suffix may be opened as."""
        if self.image_formats is not None:
            return self.image_formats
        return image_formats_for(suffix.rpartition(".")[2])

    def __call__(self, sample: dict) -> dict:
        """Return a new sample with its fields decoded; raise DecodeError naming the first that fails."""
        decoded = {}
        for field, value in sample.items():
            if field.startswith("__") or (self.only is not None and field not in self.only):
                decoded[field] = value
                continue
            try:
                decoded[field] = self.decode_field(field, value)
            except Exception as exn:
                url, key = str(sample.get("__url__")), str(sample.get("__key__"))
                raise DecodeError(url, key, field, f"{type(exn).__name__}: {exn}") from exn
        return decoded

    def decode_field(self, suffix: str, value: Any) -> Any:
        """Decode one field's value by its suffix (``"jpg"``, ``"seg.png"``, ``"json.gz"``)."""
        if not isinstance(value, (bytes, bytearray, memoryview)):
            return value
        data = bytes(value)
        while suffix == "gz" or suffix.endswith(".gz"):
            data = gunzip(data, self.limits.max_gz_bytes)
            suffix = suffix[:-3].rstrip(".")
        if not suffix:
            return data
        for handler in self.handlers:
            result = handler(suffix, data, self)
            if result is not None:
                return result
        return self._decode_builtin(suffix.rpartition(".")[2], data)

    def _decode_builtin(self, extension: str, data: bytes) -> Any:
        if extension in SAFE_DECODERS:
            return SAFE_DECODERS[extension](data)
        if extension in TRUSTING_DECODERS:
            return TRUSTING_DECODERS[extension](data, self.allow_pickle, self.limits)
        return data



@functional_datapipe("decode")
class Decoder(Pipe[dict]):
    """Yields each sample dict with its fields decoded (functional name: ``decode``).

    Fields are decoded by :class:`SampleDecoder`'s rules: the specs given here first, then
    the built-ins (text, int, JSON, msgpack, cbor, npy, npz, pth, tenbin; pickle only with
    ``allow_pickle``), by the last dot-part of each suffix; unknown fields stay bytes.
    Images, audio and video stay bytes unless a spec for them is given. A sample whose decoding fails is
    either passed whole to ``handler`` (as a DecodeError naming the shard URL, key and
    field) and skipped when the handler returns True, or the error stops the run; a
    half-decoded sample is never yielded.

    Args:
        source_datapipe: yields sample dicts (``__key__``, ``__url__``, one entry per suffix).
        *specs: image spec names (``"rgb8"``, ``"torchrgb"``, ``"pil"``, ... see
            ``IMAGE_SPECS``), ``"audio"`` and ``"video"`` (or an ``AudioSpec(sample_rate=16000,
            mono=True)``, a ``VideoSpec(start=0, duration=2, num_frames=8)``: see
            :mod:`~wds_datapipes.decoding.media`), callables ``fn(".suffix", data) -> value or None`` (None: not
            mine, try the next), or dicts ``{suffix or glob: fn(data) -> value}`` (e.g.
            ``{"seg.png": f, "*.npy": g}``). They are tried in order, before the built-ins.
        only: the field names to decode (list, or string separated by spaces or commas);
            the others stay bytes. None (default) decodes every field.
        handler: error policy (see ``wds_datapipes.handlers``); default re-raises.
        allow_pickle: decode pickle, object arrays and full ``torch.load``; only for
            shards you trust. Without it a pickle field is a DecodeError.
        num_threads: 0 decodes in the iterating thread; N > 0 decodes in a pool of N
            threads (decoders release the GIL), keeping the input order, with at most 4*N
            samples in flight.
        image_formats: None (default) opens an image field only as the format its suffix
            names (``.jpg`` as JPEG, ...); a list of Pillow format names widens that for
            every image field (``["JPEG", "PNG"]`` for mislabeled files). EPS, which starts
            Ghostscript, opens only when named here.
        limits: the largest image (pixels), ``.gz`` field, npy/npz arrays, audio and video
            decoded; by default the process's :func:`~wds_datapipes.limits.get_limits` when the pipe is built.

    Example:
        >>> from torch.utils.data.datapipes.iter import IterableWrapper
        >>> dp = IterableWrapper([{"__key__": "a", "__url__": "s.tar", "cls": b"3", "txt": b"hi"}])
        >>> list(dp.decode("torchrgb8"))
        [{'__key__': 'a', '__url__': 's.tar', 'cls': 3, 'txt': 'hi'}]
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[dict],
        *specs: Spec | AudioSpec | VideoSpec,
        only: str | Iterable[str] | None = None,
        handler: Handler = reraise_exception,
        allow_pickle: bool = False,
        num_threads: int = 0,
        image_formats: Iterable[str] | None = None,
        limits: Limits | None = None,
    ):
        self.source_datapipe = source_datapipe
        self.decoder = SampleDecoder(*specs, only=only, allow_pickle=allow_pickle, image_formats=image_formats,
                                     limits=limits)
        self.handler = handler
        self.num_threads = check_positive("num_threads", num_threads, 0)
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    def __iter__(self) -> Iterator[dict]:
        probe = stats_probe(self._stats)
        sampler = None
        if probe is not None:  # one sample in a gap timed: its decoding (with threads, the wait for it)
            probe.stage("decode", self.num_threads)
            sampler = probe.sampler("decode")
        due = sampler.due if sampler is not None else 0  # 0: off (see stats.probe.Sampler)
        try:
            if self.num_threads == 0:
                for sample in self.source_datapipe:
                    t0 = 0
                    if due:
                        due -= 1
                        if not due:
                            t0 = sampler.start()
                    decoded = self._settle(sample, self.decoder, sample)
                    if t0:
                        due = sampler.stop(t0)
                    if decoded is not None:
                        yield decoded
                    elif sampler is not None:
                        sampler.stage.errors += 1
                return
            with worker_threads(self.num_threads) as pool:
                for sample, future in ordered_map(self.decoder, self.source_datapipe, pool, 4 * self.num_threads):
                    t0 = 0
                    if due:
                        due -= 1
                        if not due:
                            t0 = sampler.start()
                    decoded = self._settle(sample, future.result)
                    if t0:
                        due = sampler.stop(t0)
                    if decoded is not None:
                        yield decoded
                    elif sampler is not None:
                        sampler.stage.errors += 1
        finally:
            if sampler is not None:
                sampler.save(due)
                probe.ended()

    def _settle(self, sample: dict, decode: Callable[..., dict], *args: Any) -> dict | None:
        """``sample`` decoded by ``decode(*args)``, or None when it failed and the handler skips it."""
        try:
            return decode(*args)
        except DecodeError as exn:
            if skips(self.handler, exn, sample):
                return None
            raise
