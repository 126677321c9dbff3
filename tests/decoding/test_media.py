"""Audio and video fields: decoded as TorchCodec decodes the same bytes, clipped, limited, batched."""

from __future__ import annotations

import logging
import math
import pickle
import struct

import pytest
import torch
import webdataset as wds
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding.media import (
    AUDIO_COPIES,
    Audio,
    AudioBatch,
    AudioSpec,
    Video,
    VideoSpec,
    collate_media,
    decode_audio,
    decode_video,
    pad_audio,
)
from wds_datapipes.limits import Limits

try:  # FFmpeg's shared libraries are loaded on import: without them torchcodec cannot decode media
    from torchcodec.decoders import AudioDecoder, VideoDecoder
    from torchcodec.encoders import AudioEncoder, VideoEncoder
except (ImportError, RuntimeError, OSError) as exn:
    pytest.skip(f"torchcodec with FFmpeg cannot be imported: {exn}", allow_module_level=True)


def _audio(fmt: str, seconds: float = 2.0, rate: int = 16000, channels: int = 2) -> bytes:
    """A chord, a different tone per channel, encoded by FFmpeg as ``fmt``."""
    t = torch.arange(int(seconds * rate)) / rate
    tones = torch.stack([0.4 * torch.sin(2 * math.pi * (330 + 110 * c) * t) for c in range(channels)])
    return AudioEncoder(tones, sample_rate=rate).to_tensor(fmt).numpy().tobytes()


def _video(fmt: str = "mp4", frames: int = 30, fps: int = 10, codec: str | None = None,
           width: int = 64, height: int = 48) -> bytes:
    """Moving colour gradients, ``frames`` at ``fps``, encoded by FFmpeg."""
    y, x = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    pictures = torch.stack([torch.stack([(4 * x + 4 * k) % 256, (4 * y + 2 * k) % 256, (x + y + 8 * k) % 256])
                            for k in range(frames)]).to(torch.uint8)
    return VideoEncoder(pictures, frame_rate=fps).to_tensor(fmt, codec=codec).numpy().tobytes()


@pytest.fixture(scope="module")
def mp4() -> bytes:
    return _video("mp4")


@pytest.fixture(scope="module")
def flac() -> bytes:
    return _audio("flac")


def _sample(field: str, data: bytes, key: str = "k0") -> dict:
    return {"__key__": key, "__url__": "mem.tar", field: data}


def _decode_one(sample: dict, *specs, **kwargs) -> dict:
    return next(iter(IterableWrapper([sample]).decode(*specs, **kwargs)))


# ---------------------------------------------------------------- values


@pytest.mark.parametrize(("suffix", "fmt"), [("flac", "flac"), ("wav", "wav"), ("mp3", "mp3"), ("ogg", "ogg"),
                                             ("opus", "opus"), ("m4a", "mp4")])
def test_audio_equals_torchcodecs_decode_of_the_same_bytes(suffix, fmt):
    data = _audio(fmt)
    audio = _decode_one(_sample(suffix, data), "audio")[suffix]
    expected = AudioDecoder(data).get_all_samples()
    assert isinstance(audio, Audio)
    assert audio.data.dtype == torch.float32 and audio.data.shape[0] == 2
    assert torch.equal(audio.data, expected.data)
    assert audio.sample_rate == expected.sample_rate


def test_audio_is_resampled_and_mixed_to_mono(flac):
    audio = decode_audio(flac, AudioSpec(sample_rate=8000, mono=True))
    resampled = AudioDecoder(flac, sample_rate=8000).get_all_samples().data
    assert audio.sample_rate == 8000
    assert audio.data.shape == (1, 16000)
    assert torch.equal(audio.data, resampled.mean(dim=0, keepdim=True))


def test_audio_clip_equals_torchcodecs_samples_played_in_the_range(flac):
    audio = decode_audio(flac, AudioSpec(start=0.5, duration=1.0))
    assert audio.data.shape == (2, 16000)
    assert torch.equal(audio.data, AudioDecoder(flac).get_samples_played_in_range(0.5, 1.5).data)


@pytest.mark.parametrize(("suffix", "codec"), [("mp4", None), ("webm", None), ("mkv", None), ("avi", None),
                                               ("avi", "mjpeg")])
def test_video_equals_torchcodecs_decode_of_every_frame(suffix, codec):
    data = _video(suffix, codec=codec)
    video = _decode_one(_sample(suffix, data), "video")[suffix]
    expected = VideoDecoder(data).get_all_frames()
    assert isinstance(video, Video)
    assert video.frames.dtype == torch.uint8 and video.frames.shape == (30, 3, 48, 64)
    assert torch.equal(video.frames, expected.data)
    assert torch.equal(video.timestamps, expected.pts_seconds)
    assert video.fps == 10.0


def test_video_clip_by_seconds_keeps_the_streams_rate(mp4):
    video = decode_video(mp4, VideoSpec(start=1.0, duration=1.5))
    expected = VideoDecoder(mp4).get_frames_played_in_range(1.0, 2.5)
    assert video.frames.shape[0] == 15
    assert torch.equal(video.frames, expected.data)
    assert torch.allclose(video.timestamps, torch.arange(10, 25, dtype=torch.float64) / 10)


def test_video_clip_at_a_frame_rate(mp4):
    video = decode_video(mp4, VideoSpec(start=0.5, duration=2.0, fps=4))
    expected = VideoDecoder(mp4).get_frames_played_in_range(0.5, 2.5, fps=4)
    assert video.frames.shape[0] == 8 and video.fps == 4.0
    assert torch.equal(video.frames, expected.data)


def test_video_clip_of_a_frame_count_spreads_them_evenly(mp4):
    video = decode_video(mp4, VideoSpec(num_frames=6))
    expected = VideoDecoder(mp4).get_frames_played_at([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert video.frames.shape == (6, 3, 48, 64)
    assert torch.equal(video.frames, expected.data)
    assert video.timestamps.tolist() == pytest.approx([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    assert video.fps == 2.0


def test_media_stays_bytes_without_a_spec_for_it(flac, mp4):
    sample = {**_sample("flac", flac), "mp4": mp4, "txt": b"hello"}
    decoded = _decode_one(sample, "torchrgb8")
    assert decoded["flac"] == flac and decoded["mp4"] == mp4 and decoded["txt"] == "hello"
    only_audio = _decode_one(sample, AudioSpec(mono=True))
    assert isinstance(only_audio["flac"], Audio) and only_audio["mp4"] == mp4


def test_specs_refuse_contradictory_or_impossible_options():
    with pytest.raises(ValueError, match="not both"):
        VideoSpec(num_frames=4, fps=2)
    with pytest.raises(ValueError, match="start"):
        AudioSpec(start=-1)
    with pytest.raises(ValueError, match="duration"):
        VideoSpec(duration=0)
    with pytest.raises(ValueError, match="sample_rate"):
        AudioSpec(sample_rate=0)


def test_a_clip_past_the_end_names_the_videos_length(mp4):
    with pytest.raises(wd.DecodeError, match=r"starts at 5.0 s; the video is 3.000 s long"):
        _decode_one(_sample("mp4", mp4), VideoSpec(start=5.0))


# ---------------------------------------------------------------- limits


def _no_decoding(monkeypatch) -> None:
    """Makes any frame or sample decoding fail the test: limits must refuse before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("decoded before the limits were checked")

    for name in ("get_all_frames", "get_frames_played_in_range", "get_frames_played_at"):
        monkeypatch.setattr(VideoDecoder, name, refuse)


def test_a_header_claiming_huge_frames_is_refused_before_decoding(monkeypatch):
    """An MJPEG AVI whose headers (the AVI's and every JPEG's) claim 8000x8000 frames."""
    data = bytearray(_video("avi", frames=5, fps=5, codec="mjpeg"))
    data[:4096] = bytes(data[:4096]).replace(struct.pack("<II", 64, 48), struct.pack("<II", 8000, 8000))
    at = data.find(b"\xff\xc0")
    while at >= 0:  # each JPEG's start of frame: marker, length, precision, height, width
        data[at + 5 : at + 9] = struct.pack(">HH", 8000, 8000)
        at = data.find(b"\xff\xc0", at + 2)
    _no_decoding(monkeypatch)
    with pytest.raises(wd.DecodeError, match=r"8000x8000, 64000000 pixels a frame.*max_frame_pixels") as caught:
        _decode_one({"__key__": "bomb", "__url__": "hostile.tar", "avi": bytes(data)}, "video")
    assert (caught.value.url, caught.value.key, caught.value.field) == ("hostile.tar", "bomb", "avi")


@pytest.mark.parametrize(("limits", "spec", "match"), [
    (Limits(max_video_frames=29), VideoSpec(), r"30 frames.*max_video_frames"),
    (Limits(max_media_seconds=2.5), VideoSpec(), r"3.0 s long.*max_media_seconds"),
    (Limits(max_media_bytes=10 * 3 * 64 * 48 - 1), VideoSpec(fps=4, duration=2.5), r"10 frames of 64x48.*max_media_bytes"),
    (Limits(max_frame_pixels=64 * 48 - 1), VideoSpec(num_frames=2), r"64x48.*max_frame_pixels"),
])
def test_videos_over_a_limit_are_refused_before_decoding(monkeypatch, mp4, limits, spec, match):
    _no_decoding(monkeypatch)
    with pytest.raises(wd.DecodeError, match=match) as caught:
        _decode_one(_sample("mp4", mp4, key="big"), spec, limits=limits)
    assert "shard 'mem.tar', sample 'big'" in str(caught.value) and caught.value.field == "mp4"


def test_a_clip_within_the_limits_of_a_longer_video_decodes(mp4):
    limits = Limits(max_video_frames=10, max_media_seconds=1.0)
    video = _decode_one(_sample("mp4", mp4), VideoSpec(start=1.0, duration=1.0), limits=limits)["mp4"]
    assert video.frames.shape[0] == 10


def test_audio_over_the_limits_is_refused(flac):
    with pytest.raises(wd.DecodeError, match=r"audio is 2.0 s long.*1.5 s \(Limits.max_media_seconds\)"):
        _decode_one(_sample("flac", flac), "audio", limits=Limits(max_media_seconds=1.5))
    # 2 channels x 16 kHz float32: 128000 bytes a second, taking AUDIO_COPIES["ffmpeg"] times that to decode
    with pytest.raises(wd.DecodeError, match=r"more than the limit of 1.0 s \(Limits.max_media_bytes"):
        _decode_one(_sample("flac", flac), "audio", limits=Limits(max_media_bytes=int(128000 * AUDIO_COPIES["ffmpeg"])))
    clip = _decode_one(_sample("flac", flac), AudioSpec(duration=1.0), limits=Limits(max_media_seconds=1.5))
    assert clip["flac"].data.shape == (2, 16000)


def test_audio_whose_header_tells_no_duration_is_decoded_only_up_to_the_limit():
    data = _audio("mkv")  # Matroska written this way has no duration in its header
    assert AudioDecoder(data).metadata.duration_seconds_from_header is None
    with pytest.raises(ValueError, match=r"at least 1.5 s long.*max_media_seconds"):
        decode_audio(data, limits=Limits(max_media_seconds=1.5))
    assert decode_audio(data, limits=Limits(max_media_seconds=3)).data.shape[1] == 32000


# ---------------------------------------------------------------- corrupt and truncated data


@pytest.mark.parametrize(("field", "data", "match"), [
    ("flac", _audio("flac")[:20000], r"corrupt or truncated audio data \(FFmpeg: "),
    ("wav", _audio("wav")[:-5], r"truncated WAV: its header says \d+ bytes of samples, \d+ follow"),
    ("mp4", _video("mp4")[:3000], r"corrupt or truncated video data \(FFmpeg: "),
    ("avi", _video("avi")[:8000], r"truncated video: its header says 30 frames, its data holds \d+"),
    ("mp3", b"ID3 this is not an mp3 at all" * 10, r"corrupt or truncated audio data"),
])
def test_corrupt_or_truncated_media_is_a_decode_error_naming_the_field(field, data, match):
    with pytest.raises(wd.DecodeError, match=match) as caught:
        _decode_one(_sample(field, data, key="bad"), "audio", "video")
    assert (caught.value.url, caught.value.key, caught.value.field) == ("mem.tar", "bad", field)
    assert "shard 'mem.tar', sample 'bad'" in str(caught.value)


def test_a_corrupt_video_is_skipped_and_logged_by_a_handler(mp4, caplog):
    damaged = bytearray(mp4)
    damaged[len(damaged) // 3 : len(damaged) // 3 + 300] = b"\x07" * 300
    samples = [_sample("mp4", mp4, "good0"), _sample("mp4", bytes(damaged), "bad"), _sample("mp4", mp4, "good1")]
    with caplog.at_level(logging.INFO, logger="wds_datapipes"):
        kept = list(IterableWrapper(samples).decode("video", handler=wd.ignore_and_continue))
    assert [s["__key__"] for s in kept] == ["good0", "good1"]
    assert "sample 'bad': field 'mp4': ValueError: corrupt or truncated video data" in caplog.text


# ---------------------------------------------------------------- batching


def test_audio_of_different_lengths_batches_padded_with_lengths():
    clips = [decode_audio(_audio("wav", seconds=s, channels=1)) for s in (1.0, 0.5, 0.25)]
    batch = pad_audio(clips)
    assert isinstance(batch, AudioBatch)
    assert batch.data.shape == (3, 1, 16000) and batch.sample_rate == 16000
    assert batch.lengths.tolist() == [16000, 8000, 4000]
    for row, clip in zip(batch.data, clips):
        n = clip.data.shape[1]
        assert torch.equal(row[:, :n], clip.data) and not row[:, n:].any()
    with pytest.raises(ValueError, match="one sample rate"):
        pad_audio([clips[0], decode_audio(_audio("wav", rate=8000, channels=1))])


def test_collate_media_batches_audio_videos_and_the_rest(mp4):
    samples = [{"__key__": f"k{i}", "wav": _audio("wav", seconds=0.5 + i / 4), "mp4": mp4, "cls": str(i).encode()}
               for i in range(3)]
    pipe = IterableWrapper(samples).decode(AudioSpec(mono=True), VideoSpec(num_frames=4))
    batch = next(iter(pipe.batch_samples(3, collate_fn=collate_media)))
    assert batch["wav"].data.shape == (3, 1, 16000) and batch["wav"].lengths.tolist() == [8000, 12000, 16000]
    assert isinstance(batch["mp4"], Video) and batch["mp4"].frames.shape == (3, 4, 3, 48, 64)
    assert batch["cls"].tolist() == [0, 1, 2] and batch["__key__"] == ["k0", "k1", "k2"]


def test_video_clips_of_one_shape_stack_with_the_default_batching(mp4):
    pipe = IterableWrapper([_sample("mp4", mp4, f"k{i}") for i in range(4)]).decode(VideoSpec(duration=1.0))
    frames, timestamps, fps = next(iter(pipe.batch_samples(4)))["mp4"]
    assert frames.shape == (4, 10, 3, 48, 64) and frames.dtype == torch.uint8
    assert timestamps.shape == (4, 10) and fps.tolist() == [10.0] * 4


# ---------------------------------------------------------------- through a shard


def test_media_shard_decodes_end_to_end(tmp_path, mp4):
    path = tmp_path / "media-000.tar"
    speech = {f"s{i}": _audio("flac", seconds=0.5 + i / 2, rate=22050) for i in range(3)}
    with wds.TarWriter(str(path)) as writer:
        for key, data in speech.items():
            writer.write({"__key__": key, "flac": data, "json": b'{"speaker": 1}'})
        writer.write({"__key__": "v0", "mp4": mp4, "txt": b"a clip"})
    pipe = (wd.ShardLister([str(path)]).load_tar().group_by_key()
            .decode(AudioSpec(sample_rate=16000, mono=True), VideoSpec(fps=5), num_threads=2))
    pipe = pickle.loads(pickle.dumps(pipe))  # loaders ship the graph to worker processes
    samples = {s["__key__"]: s for s in pipe}
    for i, key in enumerate(speech):
        audio = samples[key]["flac"]
        expected = AudioDecoder(speech[key], sample_rate=16000).get_all_samples().data.mean(dim=0, keepdim=True)
        assert audio.sample_rate == 16000 and torch.equal(audio.data, expected)
        assert audio.data.shape[1] == pytest.approx(16000 * (0.5 + i / 2), abs=1)
        assert samples[key]["json"] == {"speaker": 1}
    video = samples["v0"]["mp4"]
    assert video.frames.shape == (15, 3, 48, 64) and samples["v0"]["txt"] == "a clip"
    assert torch.equal(video.frames, VideoDecoder(mp4).get_frames_played_in_range(0.0, 3.0, fps=5).data)


@pytest.mark.parametrize("source", ["shards", "exact"])
def test_media_batches_under_dataloader_workers_and_in_exact_epochs(tmp_path, mp4, source):
    from builders import write_index
    from torch.utils.data import DataLoader

    shards, expected = [], {}
    for shard, n in enumerate([5, 3, 4]):
        path = tmp_path / f"m-{shard:03d}.tar"
        with wds.TarWriter(str(path)) as writer:
            for i in range(n):
                key, flac = f"m{shard}-{i}", _audio("flac", seconds=0.3 + 0.1 * i, rate=8000, channels=1)
                writer.write({"__key__": key, "flac": flac, "mp4": mp4})
                expected[key] = AudioDecoder(flac).get_all_samples().data
        shards.append(str(path))
    if source == "exact":
        samples = wd.ExactEpochs(write_index(shards, tmp_path / "index.json"), batch_size=2, seed=0)
    else:
        samples = wd.ShardLister(shards).load_tar().group_by_key()
    pipe = (samples.decode("audio", VideoSpec(num_frames=4)).to_tuple("__key__", "flac", "mp4")
            .batch_samples(2, collate_fn=collate_media))
    loader = DataLoader(pipe, batch_size=None, num_workers=2)
    seen = []
    for keys, audio, video in loader:
        assert isinstance(audio, AudioBatch) and audio.sample_rate == 8000
        assert video.frames.shape == (len(keys), 4, 3, 48, 64)
        for key, row, length in zip(keys, audio.data, audio.lengths, strict=True):
            assert torch.equal(row[:, :length], expected[key]) and not row[:, length:].any()  # zero-padded
        seen.extend(keys)
    assert sorted(seen) == sorted(expected)  # every sample once (12: exact epochs drop none over 1 rank)
