"""Audio and video decoding from bytes in memory: TorchCodec against PyAV, ours and webdataset's way.

    python -m benchmarks.bench_media [--audio 200] [--videos 40] [--rounds 5] [--quick]

Makes its media in memory with TorchCodec's encoders (the system FFmpeg):
- audio: --audio clips of 5 s of a 16 kHz mono tone with noise, as flac, wav and mp3;
- video: --videos clips of 2 s at 25 fps, 320x240, H.264 in mp4 (50 frames each).

Then times, one thread, bytes in memory to tensors, the rows of a format in turn (the order
reversed every other round) after a warm-up run each; a row is the median of its rounds,
its ratio to TorchCodec the median of each round's pair:
1. TorchCodec: ``AudioDecoder(bytes).get_all_samples()`` (float32 C x S; ``WavDecoder`` for
   wav) and ``VideoDecoder(bytes).get_all_frames()`` (uint8 N x C x H x W);
2. PyAV: ``av.open(BytesIO)``, frames as arrays joined and scaled to float32 in numpy;
   video frames converted to rgb24 and stacked (the same tensors, checked);
3. ours: ``decode("audio", "video")`` over the samples (TorchCodec behind it, limits checked);
4. webdataset's handlers (``torch_audio``: torchaudio.load on a temp file; ``torch_video``:
   torchvision.io.read_video on a temp file), where they import and run on this stack.
Prints samples/s and the ratios to TorchCodec's. ``--quick``: 4 audio clips, 2 videos, one round.
"""

from __future__ import annotations

import io
import math
import warnings
from collections.abc import Callable

import numpy as np
import torch

warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes  # noqa: F401 - registers decode
from benchmarks.harness import PROCESS_CLOCK, Bench, time_in_turn

try:
    from torchcodec.decoders import AudioDecoder, VideoDecoder, WavDecoder
    from torchcodec.encoders import AudioEncoder, VideoEncoder
except (ImportError, RuntimeError) as exn:  # RuntimeError: no FFmpeg libraries found
    TORCHCODEC_MISSING = f"this benchmark needs torchcodec and FFmpeg (pip install torchcodec; make ffmpeg): {exn}"
else:
    TORCHCODEC_MISSING = ""

try:
    import av
except ImportError:
    av = None

AUDIO_RATE = 16000


def make_audio(n: int, fmt: str) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        t = np.arange(5 * AUDIO_RATE) / AUDIO_RATE
        wave = 0.4 * np.sin(2 * math.pi * (200 + 10 * i) * t) + 0.05 * rng.standard_normal(t.size)
        samples = torch.from_numpy(wave.astype(np.float32))[None]
        out.append(AudioEncoder(samples, sample_rate=AUDIO_RATE).to_tensor(fmt).numpy().tobytes())
    return out


def make_videos(n: int) -> list[bytes]:
    out = []
    y, x = torch.meshgrid(torch.arange(240), torch.arange(320), indexing="ij")
    for i in range(n):
        frames = torch.stack([torch.stack([(x + 4 * k + i) % 256, (y + 2 * k) % 256, (x + y + k) % 256])
                              for k in range(50)]).to(torch.uint8)
        out.append(VideoEncoder(frames, frame_rate=25).to_tensor("mp4", crf=23).numpy().tobytes())
    return out


def tc_audio(data: bytes, fmt: str) -> torch.Tensor:
    decoder = WavDecoder(data) if fmt == "wav" else AudioDecoder(data)
    return decoder.get_all_samples().data


def tc_video(data: bytes) -> torch.Tensor:
    return VideoDecoder(data).get_all_frames().data


def av_audio(data: bytes, fmt: str) -> torch.Tensor:
    """PyAV's frames as arrays, joined and scaled to float32 in numpy (its AudioResampler,
    the general way, is 2-60x slower here on these small frames)."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = list(container.decode(stream))
    name, channels = frames[0].format.name, len(frames[0].layout.channels)
    arrays = [frame.to_ndarray() for frame in frames]
    if frames[0].format.is_planar:
        samples = np.concatenate(arrays, axis=1)
    else:  # packed: 1 x (samples * channels), interleaved
        samples = np.concatenate([a.reshape(-1, channels) for a in arrays]).T
    scale = {"s16": 1 / 32768, "s32": 1 / 2147483648}.get(name.rstrip("p"))
    samples = samples.astype(np.float32) * np.float32(scale) if scale else samples.astype(np.float32, copy=False)
    return torch.from_numpy(np.ascontiguousarray(samples))


def av_video(data: bytes) -> torch.Tensor:
    with av.open(io.BytesIO(data)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2).contiguous()


def ours(suffix: str, items: list[bytes]) -> Callable[[], int]:
    samples = [{"__key__": f"k{i}", "__url__": "mem.tar", suffix: data} for i, data in enumerate(items)]

    def run() -> int:
        return sum(1 for _ in IterableWrapper(samples).decode("audio", "video"))

    return run


def webdataset_handler(name: str, suffix: str, items: list[bytes]) -> Callable[[], int] | str:
    """webdataset's handler over the items, or why it cannot run here."""
    from webdataset import autodecode

    handler = getattr(autodecode, name)
    try:
        handler("." + suffix, items[0])
    except Exception as exn:  # noqa: BLE001 - any failure means: not available on this stack
        return f"unavailable ({type(exn).__name__}: {str(exn).splitlines()[0][:80]})"

    def run() -> int:
        return sum(1 for data in items if handler("." + suffix, data) is not None)

    return run


def per_item(fn: Callable[..., object], items: list[bytes], *args: object) -> Callable[[], int]:
    def run() -> int:
        for data in items:
            fn(data, *args)
        return len(items)

    return run


def measure(bench: Bench, title: str, paths: dict[str, Callable[[], int] | str], n: int, rounds: int) -> None:
    """The rows of one format in turn; a row that cannot run here says why."""
    runnable = {name: path for name, path in paths.items() if not isinstance(path, str)}
    timings = time_in_turn(runnable, rounds, clock=PROCESS_CLOCK, warm=True, expect=n)
    print(f"\n{title}")
    for name, path in paths.items():
        if isinstance(path, str):
            print(f"  {name:<24} {path}")
            continue
        print(f"  {name:<24} {timings.rate(name):9.1f} samples/s")
    for name in runnable:
        if name != "torchcodec":
            bench.ratio(f"{name} / torchcodec", timings.ratio(name, "torchcodec"))


def main(argv: list[str] | None = None) -> None:
    bench = Bench("bench_media", __doc__, peers=("torchcodec", "av", "webdataset", "torchaudio"), data=None)
    bench.parser.add_argument("--audio", type=int, default=200)
    bench.parser.add_argument("--videos", type=int, default=40)
    args = bench.parse(argv)
    if TORCHCODEC_MISSING:
        raise SystemExit(TORCHCODEC_MISSING)
    if args.quick:
        args.audio, args.videos = min(args.audio, 4), min(args.videos, 2)
    torch.set_num_threads(1)
    with bench.results(args):
        for fmt in ("flac", "wav", "mp3"):
            items = make_audio(args.audio, fmt)
            if av is not None:  # both decode with FFmpeg: the same samples
                assert torch.equal(tc_audio(items[0], fmt), av_audio(items[0], fmt))
            paths: dict[str, Callable[[], int] | str] = {"torchcodec": per_item(tc_audio, items, fmt)}
            paths["pyav"] = per_item(av_audio, items, fmt) if av is not None else "not installed (pip install av)"
            paths["ours decode('audio')"] = ours(fmt, items)
            paths["webdataset torch_audio"] = webdataset_handler("torch_audio", fmt, items)
            measure(bench, f"audio {fmt}: {len(items)} x 5 s 16 kHz mono, {sum(map(len, items)) // len(items)} "
                           "bytes each", paths, len(items), args.rounds)

        videos = make_videos(args.videos)
        if av is not None:
            assert torch.equal(tc_video(videos[0]), av_video(videos[0]))
        paths = {"torchcodec": per_item(tc_video, videos),
                 "pyav": per_item(av_video, videos) if av is not None else "not installed (pip install av)",
                 "ours decode('video')": ours("mp4", videos),
                 "webdataset torch_video": webdataset_handler("torch_video", "mp4", videos)}
        measure(bench, f"video mp4: {len(videos)} x 50 frames 320x240 H.264, {sum(map(len, videos)) // len(videos)} "
                       "bytes each", paths, len(videos), args.rounds)


if __name__ == "__main__":
    main()
