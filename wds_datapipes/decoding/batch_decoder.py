"""The ``decode_batches`` pipe: raw samples in, decoded batches out, images decoded into the batch."""

from __future__ import annotations

import collections
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor, Future

import numpy as np
import torch

from ..errors import DecodeError
from ..handlers import EXACT_EPOCH_FLAG, Handler, reraise_exception
from ..limits import Limits
from ..pipe_base import Pipe
from ..pipes.batching import chunks, collate, new_batch
from ..stats.meters import BatchMeter
from ..stats.probe import probe as stats_probe
from ..stats.settings import current_settings
from ..threads import check_positive, worker_threads
from ..topology import EpochClock
from ..torch_datapipes import IterDataPipe, functional_datapipe
from .decoder import SampleDecoder
from .images import IMAGE_EXTENSIONS, IMAGE_SPECS, decode_jpeg_into, jpeg_into_buffer_shape
from .specs import ImageHandler, Spec
from .vision import decode_crops_on, decode_transform_into


@functional_datapipe("decode_batches")
class BatchDecoder(Pipe[dict]):
    """Yields batches of ``batch_size`` samples, decoded and collated (functional name: ``decode_batches``).

    The result equals ``decode(*specs, ...).batch_samples(batch_size)`` on dict samples: a
    dict whose fields are collated (stacked tensors, or lists). It is faster:

    - with a uint8 RGB/RGBA image spec (``"torchrgb8"``, ``"rgb8"``, ...), the JPEGs of a
      field that share one size are decoded straight into the rows of the batch tensor
      (no copy, no image allocated on its own: ~15% of a decode-and-batch pipeline, see
      benchmarks/bench_pipeline.py); ``torch*`` batches then come out channels_last;
    - with ``transform`` (a :class:`~wds_datapipes.decoding.vision.CenterCrop` or
      :class:`~wds_datapipes.decoding.vision.RandomResizedCrop`) and ``"torchrgb8"``, every image of
      any size and format is decoded, cropped and resized into its row of an N x 3 x S x S
      batch. Where the samples of a batch each hold one image under different suffixes (a
      ``.png``, a ``.jpeg``, a ``.gif``), the crops make one N x 3 x S x S tensor under the
      first sample's suffix (pick it with ``to_tuple("jpg;png;jpeg;gif", ...)``); an image
      field only some samples have gives a list of crops, None for the others, and so does
      any other field only some samples have;
    - everything else is decoded sample by sample, in the threads too.

    Args:
        source_datapipe: raw samples, e.g. ``group_by_key()`` (shuffle them before this).
        *specs, only, allow_pickle, image_formats, limits: as for :class:`Decoder`.
        batch_size: samples per batch.
        partial: yield the last, smaller batch (default) instead of dropping it.
        handler: a sample whose decoding fails goes to ``handler`` as a DecodeError; if it
            returns True, the sample is left out of its batch, which is then smaller.
        num_threads: 0 decodes in the iterating thread. N > 0 decodes (and transforms)
            each batch's images in N threads while the next batch is read.
        transform: with ``"torchrgb8"``, turns every image field into a fixed-size crop.
            Random transforms draw from their seed, the epoch (counted as the loaders start
            epochs, or set with ``set_epoch``) and each sample's key.
        device: with ``transform``, decode each batch's JPEGs on this device in one call of
            the library's batch decoder (``"cuda"``: nvJPEG, through TorchCodec or
            torchvision), crop them there, and yield the batch on it; other formats are
            decoded on the CPU and moved. Use it in the process that trains (no loader
            workers: CUDA does not survive a fork). Untested on a GPU so far: the same code
            runs on ``"cpu"`` in the tests.

    Example:
        >>> samples.decode_batches("torchrgb8", batch_size=64, num_threads=2, transform=CenterCrop(224, 256))
    """

    def __init__(
        self,
        source_datapipe: IterDataPipe[dict],
        *specs: Spec,
        batch_size: int,
        partial: bool = True,
        only: str | Iterable[str] | None = None,
        handler: Handler = reraise_exception,
        allow_pickle: bool = False,
        num_threads: int = 0,
        image_formats: Iterable[str] | None = None,
        transform=None,
        limits: Limits | None = None,
        device: str | torch.device | None = None,
    ):
        self.source_datapipe = source_datapipe
        self.decoder = SampleDecoder(*specs, only=only, allow_pickle=allow_pickle, image_formats=image_formats,
                                     limits=limits)
        self.batch_size = check_positive("batch_size", batch_size)
        self.partial = partial
        self.handler = handler
        self.num_threads = check_positive("num_threads", num_threads, 0)
        self.transform = transform
        self.device = None if device is None else torch.device(device)
        if self.device is not None and transform is None:
            raise ValueError("device= decodes the crops of a transform on that device: give transform= too")
        self._clock = EpochClock()
        # The image spec that decodes into batch rows: only where the built-in image rule
        # is the one that applies (no user handler ahead of it) and it gives uint8 RGB(A).
        handlers = self.decoder.handlers
        image = handlers[0].spec if handlers and all(isinstance(h, ImageHandler) for h in handlers) else None
        self._row_spec = image if image and image.element == "uint8" and image.mode in ("RGB", "RGBA") else None
        if transform is not None and image != IMAGE_SPECS["torchrgb8"]:
            raise ValueError(f"a transform makes N x 3 x S x S uint8 tensors: use the 'torchrgb8' spec, not {specs!r}")
        self._stats = current_settings()  # stats on or off travel with the pipe

    _stats = None  # a pipe pickled before stats existed measures nothing

    def set_seed(self, seed: int) -> BatchDecoder:
        """Marks an epoch's start for a random transform (its draws use its own seed)."""
        self._clock.on_set_seed(seed)
        return self

    def set_epoch(self, epoch: int) -> None:
        """The next epoch, for a random transform's draws."""
        self._clock.set_epoch(epoch)

    def __iter__(self) -> Iterator[dict]:
        epoch = self._clock.start()
        probe = stats_probe(self._stats)
        meter = BatchMeter(probe, self.num_threads) if probe is not None else None  # per batch, when on
        batches = chunks(self.source_datapipe, self.batch_size, self.partial)
        with worker_threads(self.num_threads) as pool:
            # Threads decode one batch ahead of the one handed out; inline decoding would
            # only hand out each batch a batch later (a loader's first batch took twice as long).
            ahead = 1 if self.num_threads else 0
            started: collections.deque[_StartedBatch] = collections.deque()
            try:
                for samples in batches if meter is None else probe.pulled(batches):
                    t0 = meter.begin() if meter is not None else 0
                    started.append(self._start(samples, pool, epoch))
                    batch = self._finish(started.popleft(), meter) if len(started) > ahead else None
                    if meter is not None:
                        meter.end(t0, len(samples))
                    if batch is not None:
                        yield batch
                while started:
                    t0 = meter.begin() if meter is not None else 0
                    batch = self._finish(started.popleft(), meter)
                    if meter is not None:
                        meter.end(t0, 0)
                    if batch is not None:
                        yield batch
            finally:
                if meter is not None:
                    probe.ended()

    # ------------------------------------------------------------ starting a batch

    def _start(self, samples: list[dict], pool: Executor, epoch: int) -> _StartedBatch:
        """Allocates the batch rows of the fields that take them and starts decoding into them;
        the samples whose images take no rows are decoded whole, in the pool too."""
        started = _StartedBatch(samples)
        if self.transform is not None:
            for field, sources in self._image_columns(samples).items():
                self._start_transformed(started, field, sources, pool, epoch)
        elif self._row_spec is not None and all(s.keys() == samples[0].keys() for s in samples):
            for field in samples[0]:
                self._start_same_size(started, field, pool)
        if not started.rows:  # mixed sizes or formats: each sample decoded whole, in the threads
            started.whole = [pool.submit(self.decoder, sample) for sample in samples]
        return started

    def _image_columns(self, samples: list[dict]) -> dict[str, list[str | None]]:
        """The crops' tensors of a batch: their field -> the image field of each sample that
        its rows hold (None for a sample without one). An image field is its own tensor; where
        each sample has one image field and they differ (``.png``, ``.jpeg``), they make one,
        named after the first sample's."""
        fields = [[field for field in sample if self._is_image(field)] for sample in samples]
        if all(len(names) == 1 for names in fields) and len({names[0] for names in fields}) > 1:
            return {fields[0][0]: [names[0] for names in fields]}
        columns: dict[str, list[str | None]] = {}
        for i, names in enumerate(fields):
            for name in names:
                columns.setdefault(name, [None] * len(samples))[i] = name
        return columns

    def _start_transformed(self, started: _StartedBatch, field: str, sources: list[str | None], pool: Executor,
                           epoch: int) -> None:
        size = self.transform.size
        shape = (len(started.samples), 3, size, size)
        rows = _new_rows(shape) if self.device is None else torch.empty(shape, dtype=torch.uint8, device=self.device)
        started.rows[field], started.sources[field] = rows, sources
        work: list[Future] = [_settled(True) for _ in started.samples]  # a sample without this image: nothing to do
        started.work[field] = work
        images = []  # (row, bytes, formats, key) of each image to crop
        for i, (sample, source) in enumerate(zip(started.samples, sources)):
            if source is None:
                continue
            try:
                formats = self.decoder.formats_for(source)
            except ValueError as exn:  # a suffix with no safe format: that sample fails
                work[i] = _failed(exn)
                continue
            images.append((i, sample[source], formats, str(sample.get("__key__"))))
        max_pixels = self.decoder.limits.max_image_pixels
        if self.device is not None:
            done = [Future() for _ in images]
            for (i, *_), future in zip(images, done):
                work[i] = future
            pool.submit(decode_crops_on, self.device, images, self.transform, epoch, rows, max_pixels, done)
            return
        for i, data, formats, key in images:
            work[i] = pool.submit(decode_transform_into, data, formats, self.transform, key, epoch, rows[i],
                                  max_pixels)

    def _start_same_size(self, started: _StartedBatch, field: str, pool: Executor) -> None:
        mode = self._row_spec.mode
        shape = self._row_shape(field, started.samples, mode)
        if shape is None:
            return
        rows = _new_rows((len(started.samples), *shape)).numpy()
        started.rows[field], started.sources[field] = rows, [field] * len(started.samples)
        started.work[field] = [pool.submit(_decode_row, s[field], mode, rows[i]) for i, s in enumerate(started.samples)]

    def _is_image(self, field: str) -> bool:
        if field.startswith("__") or field.rpartition(".")[2] not in IMAGE_EXTENSIONS:
            return False
        return self.decoder.only is None or field in self.decoder.only

    def _row_shape(self, field: str, samples: list[dict], mode: str) -> tuple[int, int, int] | None:
        """The common HxWxC of ``field``'s JPEGs if all decode into rows exactly, else None."""
        if not self._is_image(field):
            return None
        try:
            if "JPEG" not in self.decoder.formats_for(field):
                return None
        except ValueError:  # no safe format for this suffix: the per-sample path reports it
            return None
        shapes = {
            jpeg_into_buffer_shape(s[field], mode, self.decoder.limits.max_image_pixels)
            if isinstance(s[field], (bytes, memoryview)) else None for s in samples
        }
        return shapes.pop() if len(shapes) == 1 and None not in shapes else None

    # ------------------------------------------------------------ finishing a batch

    def _finish(self, started: _StartedBatch, meter: BatchMeter | None = None) -> dict | None:
        """Waits for the decoding, drops the samples that failed (through the handler), collates;
        None where every sample failed and the handler skipped them."""
        samples = started.samples
        failed = self._wait_for_rows(started)
        decoded: list[dict | None] = [None] * len(samples)
        for i, sample in enumerate(samples):
            if i in failed:
                continue
            try:
                if started.whole is not None:
                    decoded[i] = started.whole[i].result()
                else:
                    in_rows = {sources[i] for sources in started.sources.values()}
                    decoded[i] = self.decoder({k: v for k, v in sample.items() if k not in in_rows})
            except DecodeError as exn:
                failed[i] = exn
        if meter is not None:
            meter.failed(len(failed))
        for i in sorted(failed):
            if not self.handler(failed[i]):
                raise failed[i]
        keep = [i for i in range(len(samples)) if i not in failed]
        if not keep:
            if any(EXACT_EPOCH_FLAG in s for s in samples):  # a batch of an exact epoch must not vanish
                raise failed[min(failed)]
            return None
        t0 = meter.collating() if meter is not None else 0
        batch = self._collate([decoded[i] for i in keep])
        for field, rows in started.rows.items():
            sources = started.sources[field]
            if any(sources[i] is None for i in keep):  # an image only some samples have
                batch[field] = [rows[i] if sources[i] is not None else None for i in keep]
            else:
                batch[field] = self._as_batch(rows if len(keep) == len(samples) else rows[keep])
        if meter is not None:
            meter.collated(t0)
        return batch

    def _collate(self, samples: list[dict]) -> dict | list:
        """The batch of decoded samples: ``collate``'s (a list of dicts where their fields differ,
        as ``decode().batch_samples()`` gives); with a transform always a dict, a field only
        some samples have as a list with None for the others."""
        if self.transform is None or all(s.keys() == samples[0].keys() for s in samples):
            return collate(samples)
        fields = dict.fromkeys(field for sample in samples for field in sample)
        return {field: collate([s[field] for s in samples]) if all(field in s for s in samples)
                else [s.get(field) for s in samples] for field in fields}

    def _wait_for_rows(self, started: _StartedBatch) -> dict[int, DecodeError]:
        """Waits for the rows; a JPEG simplejpeg refused is decoded again (Pillow), in order."""
        failed: dict[int, DecodeError] = {}
        for field, outcomes in started.work.items():
            for i, outcome in enumerate(outcomes):
                if i in failed:
                    continue
                try:
                    done = outcome.result()
                except Exception as exn:  # noqa: BLE001 - any decoder error of a transformed image
                    failed[i] = _decode_error(started.samples[i], started.sources[field][i], exn)
                    continue
                if done is False:  # simplejpeg refused it: the per-sample decoder (Pillow) may still read it
                    try:
                        self._redecode_into(started.rows[field][i], field, started.samples[i])
                    except DecodeError as exn:
                        failed[i] = exn
        return failed

    def _as_batch(self, rows: np.ndarray | torch.Tensor) -> torch.Tensor | np.ndarray:
        if isinstance(rows, torch.Tensor):  # transformed: N x 3 x S x S, contiguous
            return rows
        batch = torch.from_numpy(rows)
        return batch.permute(0, 3, 1, 2) if self._row_spec.container == "torch" else batch

    def _redecode_into(self, row: np.ndarray, field: str, sample: dict) -> None:
        value = self.decoder({"__url__": sample.get("__url__"), "__key__": sample.get("__key__"),
                              field: sample[field]})[field]
        pixels = value.permute(1, 2, 0).numpy() if self._row_spec.container == "torch" else np.asarray(value)
        if pixels.shape != row.shape:
            url, key = str(sample.get("__url__")), str(sample.get("__key__"))
            raise DecodeError(url, key, field, f"decoded to {pixels.shape}, the batch holds {row.shape}")
        row[...] = pixels


class _StartedBatch:
    """A batch being decoded: its samples, the rows per field and their jobs, or one job per sample."""

    def __init__(self, samples: list[dict]):
        self.samples = samples
        self.rows: dict[str, np.ndarray | torch.Tensor] = {}
        self.sources: dict[str, list[str | None]] = {}  # per field of rows: each sample's field they hold
        self.work: dict[str, list[Future]] = {}
        self.whole: list[Future] | None = None


def _decode_row(data: bytes, mode: str, row: np.ndarray) -> bool:
    """Decodes into ``row``; False where simplejpeg refuses the JPEG (Pillow retries it later, in order)."""
    try:
        decode_jpeg_into(data, mode, row)
        return True
    except ValueError:  # simplejpeg's word for a JPEG it cannot read
        return False


def _new_rows(shape: tuple[int, ...]) -> torch.Tensor:
    """An uninitialised uint8 tensor for a batch's rows; in shared memory in a loader's worker
    process, which sends it to the main process without copying it there (~5 ms a batch of
    64 224x224 crops on this machine, ~8% of decoding it): :func:`new_batch`."""
    return new_batch(shape)


def _settled(result: object) -> Future:
    future: Future = Future()
    future.set_result(result)
    return future


def _failed(exn: Exception) -> Future:
    future: Future = Future()
    future.set_exception(exn)
    return future


def _decode_error(sample: dict, field: str, exn: BaseException) -> DecodeError:
    error = DecodeError(str(sample.get("__url__")), str(sample.get("__key__")), field, f"{type(exn).__name__}: {exn}")
    error.__cause__ = exn
    return error
