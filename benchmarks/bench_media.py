"""Audio and video decoding from bytes in memory: TorchCodec against PyAV, ours and webdataset's way.

    python benchmarks/bench_media.py [--audio 200] [--videos 40] [--repeats 3]

Makes its media in memory with TorchCodec's encoders (the system FFmpeg):
- audio: --audio clips of 5 s of a 16 kHz mono tone with noise, as flac, wav and mp3;
- video: --videos clips of 2 s at 25 fps, 320x240, H.264 in mp4 (50 frames each).

Then times, each row the best of --repeats, one thread, bytes in memory to tensors:
1. TorchCodec: ``AudioDecoder(bytes).get_all_samples()`` (float32 C x S; ``WavDecoder`` for
   wav) and ``VideoDecoder(bytes).get_all_frames()`` (uint8 N x C x H x W);
2. PyAV: ``av.open(BytesIO)``, frames as arrays joined and scaled to float32 in numpy;
   video frames converted to rgb24 and stacked (the same tensors, checked);
3. ours: ``decode("audio", "video")`` over the samples (TorchCodec behind it, limits checked);
4. webdataset's handlers (``torch_audio``: torchaudio.load on a temp file; ``torch_video``:
   torchvision.io.read_video on a temp file), where they import and run on this stack.
Prints samples/s and the ratios to TorchCodec's.
"""

from __future__ import annotations

import argparse
import io
import math
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
warnings.filterwarnings("ignore", message=r"(?s).*'datapipes', 'dataloader2' modules are deprecated")

from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes  # noqa: F401 - registers decode

try:
    import torchcodec
    from torchcodec.decoders import AudioDecoder, VideoDecoder, WavDecoder
    from torchcodec.encoders import AudioEncoder, VideoEncoder
except (ImportError, RuntimeError) as exn:  # RuntimeError: no FFmpeg libraries found
    sys.exit(f"this benchmark needs torchcodec and FFmpeg (pip install torchcodec; apt-get install ffmpeg): {exn}")

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


def best_rate(run: Callable[[], int], n: int, repeats: int) -> float:
    run()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        assert run() == n
        times.append(time.perf_counter() - start)
    return n / min(times)


def per_item(fn: Callable[..., object], items: list[bytes], *args: object) -> Callable[[], int]:
    def run() -> int:
        for data in items:
            fn(data, *args)
        return len(items)

    return run


def report(title: str, rows: list[tuple[str, float | str]]) -> None:
    base = next(rate for name, rate in rows if name == "torchcodec")
    print(f"\n{title}")
    for name, rate in rows:
        if isinstance(rate, str):
            print(f"  {name:<24} {rate}")
        else:
            print(f"  {name:<24} {rate:9.1f} samples/s   x{rate / base:5.2f} of torchcodec")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--audio", type=int, default=200)
    parser.add_argument("--videos", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, torchcodec {torchcodec.__version__}, "
          f"av {av.__version__ if av else 'not installed'}, python {platform.python_version()}, "
          f"{os.cpu_count()} cores")

    for fmt in ("flac", "wav", "mp3"):
        items = make_audio(args.audio, fmt)
        if av is not None:  # both decode with FFmpeg: the same samples
            assert torch.equal(tc_audio(items[0], fmt), av_audio(items[0], fmt))
        rows: list[tuple[str, float | str]] = [("torchcodec", best_rate(per_item(tc_audio, items, fmt),
                                                                        len(items), args.repeats))]
        if av is not None:
            rows.append(("pyav", best_rate(per_item(av_audio, items, fmt), len(items), args.repeats)))
        rows.append(("ours decode('audio')", best_rate(ours(fmt, items), len(items), args.repeats)))
        peer = webdataset_handler("torch_audio", fmt, items)
        rows.append(("webdataset torch_audio", peer if isinstance(peer, str) else
                     best_rate(peer, len(items), args.repeats)))
        report(f"audio {fmt}: {len(items)} x 5 s 16 kHz mono, {sum(map(len, items)) // len(items)} bytes each", rows)

    videos = make_videos(args.videos)
    if av is not None:
        assert torch.equal(tc_video(videos[0]), av_video(videos[0]))
    rows = [("torchcodec", best_rate(per_item(tc_video, videos), len(videos), args.repeats))]
    if av is not None:
        rows.append(("pyav", best_rate(per_item(av_video, videos), len(videos), args.repeats)))
    rows.append(("ours decode('video')", best_rate(ours("mp4", videos), len(videos), args.repeats)))
    peer = webdataset_handler("torch_video", "mp4", videos)
    rows.append(("webdataset torch_video", peer if isinstance(peer, str) else
                 best_rate(peer, len(videos), args.repeats)))
    report(f"video mp4: {len(videos)} x 50 frames 320x240 H.264, {sum(map(len, videos)) // len(videos)} bytes each",
           rows)


if __name__ == "__main__":
    main()
