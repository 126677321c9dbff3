"""Audio and video fields: their suffixes, the limits checked before decoding, the decode, the batching.

TorchCodec decodes them, straight from the field's bytes (no temporary file), with the
system's FFmpeg libraries (``pip install torchcodec``; ``apt-get install ffmpeg``). Media
is decoded only where a spec asks for it, as images are: ``decode("audio", "video")``, or
:class:`AudioSpec` / :class:`VideoSpec` objects for options::

    samples.decode(AudioSpec(sample_rate=16000, mono=True), VideoSpec(num_frames=8))

- audio (flac wav mp3 ogg oga opus m4a) -> :class:`Audio`: float32 channels x samples in
  [-1, 1] and the sample rate; optionally resampled (FFmpeg's swresample), mixed to mono
  (the mean of the channels) and cut to a clip;
- video (mp4 m4v mov webm mkv avi ogv) -> :class:`Video`: uint8 frames N x 3 x H x W (RGB),
  their timestamps (seconds, float64) and their rate; the whole stream, or a clip (start
  and duration) at the stream's rate, at a given rate, or as N evenly spaced frames.

Before anything is decoded, the container's metadata is checked against
:class:`~wds_datapipes.limits.Limits` (``max_media_seconds``, ``max_video_frames``,
``max_frame_pixels``, ``max_media_bytes``). A video's metadata comes from a demux of every
packet (TorchCodec's exact mode: the frame count and times are the packets', not what a
header claims); audio is decoded only up to what the limits allow, so a header that lies
about the duration cannot make it decode more, and ``max_media_bytes`` bounds what decoding
audio takes at its peak (:data:`AUDIO_COPIES`). A WAV's chunks are read first
(:mod:`.wav`): a cut one raises on every path, one written to a pipe decodes what follows. Values equal TorchCodec's own decode of the
same bytes. :func:`collate_media` batches audio of different lengths (zero-padded, with
the lengths); videos of one shape stack with the default ``batch_samples``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ..limits import Limits, get_limits
from ..pipes.batching import collate
from .wav import WavView, wav_layout

if TYPE_CHECKING:
    from .specs import DecodeContext

__all__ = [
    "AUDIO_COPIES",
    "AUDIO_EXTENSIONS",
    "VIDEO_EXTENSIONS",
    "Audio",
    "AudioBatch",
    "AudioSpec",
    "MediaHandler",
    "Video",
    "VideoSpec",
    "collate_media",
    "decode_audio",
    "decode_video",
    "media_handler",
    "pad_audio",
]

AUDIO_EXTENSIONS = frozenset({"flac", "wav", "mp3", "ogg", "oga", "opus", "m4a"})
VIDEO_EXTENSIONS = frozenset({"mp4", "m4v", "mov", "webm", "mkv", "avi", "ogv"})

#: How many times the size of its output (float32 channels x samples) decoding one audio field
#: takes at its peak, which ``Limits.max_media_bytes`` bounds: FFmpeg's path (TorchCodec's
#: AudioDecoder) holds the decoded frames and then their concatenation, and a little more;
#: TorchCodec's WAV reader writes the samples once. Mixing to mono adds 1/channels on the WAV
#: path (on FFmpeg's, the frames are gone by then). tests/decoding/test_media_memory.py
#: measures the peak of each path under these budgets.
AUDIO_COPIES = {"ffmpeg": 2.5, "wav": 1.0}

#: Seconds by which a frame may start after a time and still count as the one shown at it
#: (``VideoSpec(num_frames=...)``): Matroska and WebM round timestamps to the millisecond, the
#: clip's end too, so a frame may start up to half a millisecond late and the even times drift
#: up to a millisecond early over the clip: 2 ms covers both.
FRAME_TIME_SLACK = 2e-3


class Audio(NamedTuple):
    """Decoded audio: ``data`` float32 channels x samples in [-1, 1], ``sample_rate`` in Hz."""

    data: torch.Tensor
    sample_rate: int


class Video(NamedTuple):
    """Decoded video: ``frames`` uint8 N x 3 x H x W (RGB), ``timestamps`` of each frame (seconds,
    float64, when it is shown), ``fps`` the rate of these frames (the stream's average rate, or
    the one asked for)."""

    frames: torch.Tensor
    timestamps: torch.Tensor
    fps: float


class AudioBatch(NamedTuple):
    """Audio of several samples: ``data`` B x C x S float32, zero-padded to the longest;
    ``lengths`` (int64, B) the samples of each before padding; the common ``sample_rate``."""

    data: torch.Tensor
    lengths: torch.Tensor
    sample_rate: int


@dataclass(frozen=True)
class AudioSpec:
    """How audio fields are decoded: ``decode(AudioSpec(sample_rate=16000, mono=True))``.

    Args:
        sample_rate: resample to this rate (Hz); None keeps the stream's.
        mono: mix the channels into one (their mean), giving 1 x samples.
        start: seconds from the stream's start where the clip begins.
        duration: seconds of the clip; None: to the end.
        extensions: the suffixes (last dot-part) decoded as audio.
    """

    sample_rate: int | None = None
    mono: bool = False
    start: float = 0.0
    duration: float | None = None
    extensions: frozenset[str] = AUDIO_EXTENSIONS

    def __post_init__(self):
        if self.sample_rate is not None and (isinstance(self.sample_rate, bool) or self.sample_rate <= 0):
            raise ValueError(f"sample_rate must be a positive number of Hz, not {self.sample_rate!r}")
        _check_clip(self.start, self.duration)
        object.__setattr__(self, "extensions", frozenset(self.extensions))


@dataclass(frozen=True)
class VideoSpec:
    """How video fields are decoded: ``decode(VideoSpec(start=1.0, duration=2.0, fps=4))``.

    Without ``fps`` or ``num_frames``, the clip's frames are all decoded, at the stream's rate.

    Args:
        start: seconds from the stream's start where the clip begins.
        duration: seconds of the clip; None: to the end.
        num_frames: decode this many frames, evenly spaced over the clip: the i-th is the frame
            shown at ``start + i * clip / num_frames``, i.e. the last frame starting at or
            before that time plus ``FRAME_TIME_SLACK`` (2 ms, at most a quarter frame: floats
            and containers' rounded times put frames a hair late), among those starting in the
            clip. With num_frames <= clip x rate, each frame once, in order.
        fps: decode the frames shown at this rate over the clip (repeating or skipping frames).
        extensions: the suffixes (last dot-part) decoded as video.
    """

    start: float = 0.0
    duration: float | None = None
    num_frames: int | None = None
    fps: float | None = None
    extensions: frozenset[str] = VIDEO_EXTENSIONS

    def __post_init__(self):
        _check_clip(self.start, self.duration)
        if self.num_frames is not None and self.fps is not None:
            raise ValueError("give num_frames or fps, not both")
        if self.num_frames is not None and (isinstance(self.num_frames, bool) or self.num_frames <= 0):
            raise ValueError(f"num_frames must be a positive int, not {self.num_frames!r}")
        if self.fps is not None and not self.fps > 0:
            raise ValueError(f"fps must be positive, not {self.fps!r}")
        object.__setattr__(self, "extensions", frozenset(self.extensions))


def _check_clip(start: float, duration: float | None) -> None:
    if not start >= 0:
        raise ValueError(f"start must be >= 0 seconds, not {start!r}")
    if duration is not None and not duration > 0:
        raise ValueError(f"duration must be > 0 seconds (or None: to the end), not {duration!r}")


# ---------------------------------------------------------------- decoding


def decode_audio(data: bytes, spec: AudioSpec | None = None, limits: Limits | None = None,
                 extension: str | None = None) -> Audio:
    """Decode audio bytes (any format FFmpeg reads) as ``spec`` says; see :class:`AudioSpec`.

    Raises ValueError for data that is corrupt, truncated (a WAV always: its chunks are read
    first, on every path; other formats where FFmpeg notices) or over the limits
    (``max_media_seconds``, and ``max_media_bytes`` for the memory the decode takes, see
    :data:`AUDIO_COPIES`), before decoding where the metadata tells, and otherwise as soon
    as the decoded audio reaches them. A WAV of unknown length (written to a pipe) holds the
    sample frames that follow its header. PCM and float WAVs not resampled take TorchCodec's
    faster WAV reader; ``extension`` is accepted for compatibility (the bytes tell a WAV).
    """
    spec = spec or AudioSpec()
    limits = limits or get_limits()
    decoders = _torchcodec()
    layout = wav_layout(data)  # None: not a WAV

    def source() -> bytes | WavView:
        return data if layout is None or not layout.streamed else WavView(data, layout)

    decoder = None
    # TorchCodec 0.17's WAV reader reads an extensible float WAV's samples as integers: FFmpeg reads those.
    if layout is not None and spec.sample_rate is None and not (layout.extensible and layout.encoding == 3):
        try:
            decoder = decoders.WavDecoder(source())
        except RuntimeError:  # not PCM or float (a-law, ADPCM, ...): FFmpeg's decoders read it
            decoder = None
    fast = decoder is not None
    if decoder is None:
        decoder = _media_call("audio", decoders.AudioDecoder, source(), sample_rate=spec.sample_rate)
    meta = decoder.metadata
    channels, rate_in = max(meta.num_channels or 1, 1), max(meta.sample_rate or 1, 1)
    rate_out = spec.sample_rate or rate_in
    copies = AUDIO_COPIES["wav" if fast else "ffmpeg"]
    if spec.mono and channels > 1:
        copies += 1 / channels  # the mean, beside the samples (and the freed frames, still resident)
    # The bytes a second of the output costs while it is decoded (see AUDIO_COPIES).
    per_second = 4 * channels * rate_out * copies
    allowed = min(limits.max_media_seconds, limits.max_media_bytes / per_second)
    header = meta.duration_seconds_from_header
    length = spec.duration if spec.duration is not None else None if header is None else header - spec.start
    if length is not None and length > allowed:
        raise ValueError(_too_long("audio", length, allowed, channels, rate_out, copies, limits))
    start = (meta.begin_stream_seconds or 0.0) + spec.start
    stop = start + (spec.duration if spec.duration is not None else allowed)  # a bound even if the header lies
    samples = _media_call("audio", decoder.get_samples_played_in_range, start, stop)
    audio = samples.data
    # Reaching the bound means more may follow. Decoders start a few ms late (priming), hence the slack.
    if spec.duration is None and samples.pts_seconds + audio.shape[1] / samples.sample_rate >= stop - 0.05:
        raise ValueError(_too_long("audio", allowed, allowed, channels, rate_out, copies, limits, at_least=True))
    if spec.mono and audio.shape[0] > 1:
        audio = audio.mean(dim=0, keepdim=True)
    return Audio(audio, int(samples.sample_rate))


def decode_video(data: bytes, spec: VideoSpec | None = None, limits: Limits | None = None) -> Video:
    """Decode video bytes (any container and codec FFmpeg reads) as ``spec`` says; see :class:`VideoSpec`.

    The packets are demuxed first (nothing decoded), and the frame size, the clip's duration,
    its frame count and their bytes are checked against ``limits``. Raises ValueError for
    data that is corrupt, truncated (fewer frames than the header or the demux counted)
    or over the limits.
    """
    spec = spec or VideoSpec()
    limits = limits or get_limits()
    decoder = _media_call("video", _torchcodec().VideoDecoder, data, seek_mode="exact")  # demuxes, decodes nothing
    meta = decoder.metadata
    width, height, total = meta.width, meta.height, meta.num_frames
    if width * height > limits.max_frame_pixels:
        raise ValueError(f"the video is {width}x{height}, {width * height} pixels a frame: more than the limit "
                         f"of {limits.max_frame_pixels} (Limits.max_frame_pixels)")
    claimed = meta.num_frames_from_header
    if claimed and total < claimed:
        raise ValueError(f"truncated video: its header says {claimed} frames, its data holds {total}")
    begin, end = meta.begin_stream_seconds, meta.end_stream_seconds
    start = begin + spec.start
    if start >= end:
        raise ValueError(f"the clip starts at {spec.start} s; the video is {end - begin:.3f} s long")
    stop = end if spec.duration is None else min(end, start + spec.duration)
    length = stop - start
    if length > limits.max_media_seconds:
        raise ValueError(f"the video (clip) is {length:.1f} s long: more than the limit of "
                         f"{limits.max_media_seconds} s (Limits.max_media_seconds)")
    whole = spec.start == 0 and spec.duration is None and spec.fps is None and spec.num_frames is None
    rate = meta.average_fps or 0.0  # None for a video of one frame
    if spec.num_frames is not None:
        count = spec.num_frames
    elif spec.fps is not None:
        count = _frames_in(length, spec.fps)
    else:  # the clip's frames at the stream's rate (for a part, the count its average rate gives)
        count = total if whole or not rate else min(total, _frames_in(length, rate))
    _check_frames(count, width, height, limits)
    if spec.num_frames is not None:
        times = _sample_times(start, stop, spec.num_frames, (end - begin) / max(total, 1))
        batch = _media_call("video", decoder.get_frames_played_at, times)
    elif whole:
        batch = _media_call("video", decoder.get_all_frames)
    else:
        batch = _media_call("video", decoder.get_frames_played_in_range, start, stop, fps=spec.fps)
    decoded = batch.data.shape[0]
    if whole and decoded < total:
        raise ValueError(f"corrupt video: {decoded} of its {total} frames decoded")
    _check_frames(decoded, width, height, limits)  # a variable-rate clip may hold more than its average says
    fps = spec.fps or (spec.num_frames / length if spec.num_frames else rate)
    return Video(batch.data, batch.pts_seconds, float(fps))


def _sample_times(start: float, stop: float, count: int, frame: float) -> list[float]:
    """The times whose frames ``VideoSpec(num_frames=count)`` takes: ``start + i * clip / count``,
    each a little later (``FRAME_TIME_SLACK``, at most a quarter of a ``frame``'s duration) so
    that a frame a float or a container's rounding puts a hair after it still counts as shown
    there; kept inside the clip."""
    slack = min(FRAME_TIME_SLACK, frame / 4)
    last = math.nextafter(stop, -math.inf)
    return [min(start + i * (stop - start) / count + slack, last) for i in range(count)]


def _frames_in(seconds: float, fps: float) -> int:
    """The frames shown in a half-open span of ``seconds`` at ``fps``, at most (rounding forgiven)."""
    return math.ceil(seconds * fps - 1e-6)


def _check_frames(count: int, width: int, height: int, limits: Limits) -> None:
    if count > limits.max_video_frames:
        raise ValueError(f"the video (clip) has {count} frames: more than the limit of {limits.max_video_frames} "
                         "(Limits.max_video_frames)")
    size = count * 3 * width * height
    if size > limits.max_media_bytes:
        raise ValueError(f"{count} frames of {width}x{height} take {size} bytes: more than the limit of "
                         f"{limits.max_media_bytes} (Limits.max_media_bytes)")


def _too_long(kind: str, seconds: float, allowed: float, channels: int, rate: int, copies: float, limits: Limits,
              at_least: bool = False) -> str:
    which = ("max_media_seconds" if allowed == limits.max_media_seconds
             else f"max_media_bytes, {limits.max_media_bytes} bytes for {channels} x {rate} Hz float32, "
                  f"which takes {copies:g}x its size while it is decoded")
    return (f"the {kind} is {'at least ' if at_least else ''}{seconds:.1f} s long: more than the limit of "
            f"{allowed:.1f} s (Limits.{which})")


# TorchCodec's errors start with where in its C++ they were raised: "fn, /path/File.cpp:123, ".
_SOURCE_PLACE = re.compile(r"^\w+, \S+:\d+, ")


def _media_call(kind: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``; FFmpeg's failures (RuntimeError) become a ValueError that says
    the data is corrupt or truncated."""
    try:
        return fn(*args, **kwargs)
    except RuntimeError as exn:
        reason = _SOURCE_PLACE.sub("", str(exn).strip().splitlines()[0] if str(exn).strip() else repr(exn))
        raise ValueError(f"corrupt or truncated {kind} data (FFmpeg: {reason})") from exn


def _torchcodec() -> Any:
    """``torchcodec.decoders``, or an ImportError that says what to install."""
    try:
        from torchcodec import decoders
    except (ImportError, RuntimeError, OSError) as exn:  # RuntimeError/OSError: FFmpeg's libraries missing
        raise ImportError(
            "decoding audio and video needs torchcodec and FFmpeg's shared libraries: "
            f"pip install 'wds-datapipes[media]' and apt-get install ffmpeg ({type(exn).__name__}: {exn})"
        ) from None
    return decoders


# ---------------------------------------------------------------- decode specs


class MediaHandler:
    """An audio or video spec, compiled: decodes the fields whose last dot-part is one of its suffixes."""

    def __init__(self, spec: AudioSpec | VideoSpec):
        self.spec = spec

    def __call__(self, suffix: str, data: bytes, decoder: DecodeContext) -> Audio | Video | None:
        extension = suffix.rpartition(".")[2]
        if extension not in self.spec.extensions:
            return None
        if isinstance(self.spec, AudioSpec):
            return decode_audio(data, self.spec, decoder.limits, extension)
        return decode_video(data, self.spec, decoder.limits)


def media_handler(spec: Any) -> MediaHandler | None:
    """The handler of an audio or video spec (``"audio"``, ``"video"``, an AudioSpec or a
    VideoSpec); None for any other spec."""
    if isinstance(spec, str) and spec in ("audio", "video"):
        spec = AudioSpec() if spec == "audio" else VideoSpec()
    return MediaHandler(spec) if isinstance(spec, (AudioSpec, VideoSpec)) else None


# ---------------------------------------------------------------- batching


def pad_audio(clips: Sequence[Audio]) -> AudioBatch:
    """One batch of audio of any lengths: zero-padded to the longest, with each one's length.

    All must have the same sample rate and channel count (resample, or mix to mono, when decoding).
    """
    rates = {clip.sample_rate for clip in clips}
    channels = {clip.data.shape[0] for clip in clips}
    if len(rates) > 1 or len(channels) > 1:
        raise ValueError(f"audio of one batch needs one sample rate and channel count, got rates {sorted(rates)} "
                         f"and channels {sorted(channels)}: decode with AudioSpec(sample_rate=..., mono=True)")
    lengths = torch.tensor([clip.data.shape[1] for clip in clips], dtype=torch.int64)
    data = torch.zeros((len(clips), channels.pop(), int(lengths.max())), dtype=clips[0].data.dtype)
    for row, clip in zip(data, clips):
        row[:, : clip.data.shape[1]] = clip.data
    return AudioBatch(data, lengths, rates.pop())


def collate_media(items: Sequence[Any]) -> Any:
    """:func:`~wds_datapipes.pipes.batching.collate` that batches audio and video too, as the
    ``collate_fn`` of ``batch_samples``: :class:`Audio` values become an :class:`AudioBatch`
    (padded, with lengths); :class:`Video` values of one shape a Video of B x N x 3 x H x W
    frames, B x N timestamps and B rates (float64); the rest as ``collate`` does.

    Example:
        >>> samples.decode(AudioSpec(sample_rate=16000, mono=True)).batch_samples(32, collate_fn=collate_media)
    """
    first = items[0]
    if isinstance(first, Audio) and all(isinstance(x, Audio) for x in items):
        return pad_audio(items)
    if isinstance(first, Video) and all(isinstance(x, Video) for x in items):
        batch = collate(items)
        return Video(*batch) if isinstance(batch, tuple) else batch
    if isinstance(first, dict) and all(isinstance(x, dict) and x.keys() == first.keys() for x in items):
        return {key: collate_media([x[key] for x in items]) for key in first}
    if type(first) is tuple and all(type(x) is tuple and len(x) == len(first) for x in items):
        return tuple(collate_media(column) for column in zip(*items))
    return collate(items)

