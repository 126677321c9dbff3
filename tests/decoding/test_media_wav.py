"""WAV fields of every sample format, written to files and to pipes, whole and cut: decoded as their
samples say on every path, or a DecodeError naming the member."""

from __future__ import annotations

import io
import shutil
import struct
import subprocess
import wave

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding.media import AudioSpec
from wds_datapipes.decoding.wav import wav_layout

try:  # FFmpeg's shared libraries are loaded on import: without them torchcodec cannot decode media
    import torchcodec.decoders  # noqa: F401
except (ImportError, RuntimeError, OSError) as exn:
    pytest.skip(f"torchcodec with FFmpeg cannot be imported: {exn}", allow_module_level=True)

# sample format -> (numpy type of its samples, the full scale that maps them to [-1, 1], offset)
FORMATS = {
    "u8": (np.dtype("u1"), 128, 128),
    "s16": (np.dtype("<i2"), 1 << 15, 0),
    "s24": (None, 1 << 23, 0),
    "s32": (np.dtype("<i4"), 1 << 31, 0),
    "f32": (np.dtype("<f4"), 1, 0),
}
# the specs every WAV goes through: TorchCodec's WAV reader, FFmpeg's decoders (the README's spec), mono
SPECS = ["audio", AudioSpec(mono=True), AudioSpec(sample_rate=16000, mono=True), AudioSpec(sample_rate=8000)]


def _pcm(fmt: str, samples: np.ndarray) -> bytes:
    """Interleaved frames x channels ``samples`` in [-1, 1) as the bytes of ``fmt``."""
    dtype, scale, offset = FORMATS[fmt]
    if fmt == "f32":
        return samples.astype("<f4").tobytes()
    ints = np.clip(np.round(samples * scale), -scale, scale - 1).astype(np.int64) + offset
    if fmt == "s24":
        return b"".join(int(v).to_bytes(3, "little", signed=True) for v in ints.ravel())
    return ints.astype(dtype).tobytes()


def _values(fmt: str, pcm: bytes, channels: int) -> np.ndarray:
    """The oracle: the samples of raw ``pcm`` as channels x frames float64, by the format's scale."""
    dtype, scale, offset = FORMATS[fmt]
    if fmt == "s24":
        padded = np.frombuffer(pcm, np.uint8).reshape(-1, 3)
        ints = (padded[:, 0].astype(np.int32) | padded[:, 1].astype(np.int32) << 8
                | padded[:, 2].astype(np.int8).astype(np.int32) << 16)
    else:
        ints = np.frombuffer(pcm, dtype)
    return ((ints.astype(np.float64) - offset) / scale).reshape(-1, channels).T


def _wav(fmt: str, channels: int, rate: int, pcm: bytes) -> bytes:
    """A WAV of ``pcm``: integer formats written by Python's wave module, float by hand (format 3)."""
    if fmt != "f32":
        out = io.BytesIO()
        with wave.open(out, "wb") as writer:
            writer.setnchannels(channels)
            writer.setsampwidth(FORMATS[fmt][0].itemsize if fmt != "s24" else 3)
            writer.setframerate(rate)
            writer.writeframes(pcm)
        return out.getvalue()
    fmt_chunk = struct.pack("<HHIIHH", 3, channels, rate, rate * channels * 4, channels * 4, 32)
    return (b"RIFF" + struct.pack("<I", 4 + 8 + len(fmt_chunk) + 8 + len(pcm)) + b"WAVE"
            + b"fmt " + struct.pack("<I", len(fmt_chunk)) + fmt_chunk + b"data" + struct.pack("<I", len(pcm)) + pcm)


def _as_piped(data: bytes) -> bytes:
    """The WAV as a writer that cannot seek back leaves it: RIFF and data sizes 0xFFFFFFFF."""
    layout = wav_layout(data)
    piped = bytearray(data)
    piped[4:8] = piped[layout.size_at : layout.size_at + 4] = b"\xff\xff\xff\xff"
    return bytes(piped)


def _decode(data: bytes, spec, key: str = "k") -> torch.Tensor:
    sample = {"__key__": key, "__url__": "mem.tar", "wav": data}
    return next(iter(IterableWrapper([sample]).decode(spec)))["wav"]


def _expected(values: np.ndarray, rate: int, spec) -> np.ndarray | None:
    """What ``spec`` makes of the oracle's ``values``; None where it resamples (FFmpeg's resampler has no oracle here)."""
    if not isinstance(spec, str) and spec.sample_rate not in (None, rate):
        return None
    return values.mean(axis=0, keepdims=True) if not isinstance(spec, str) and spec.mono else values


wav_shapes = st.tuples(st.sampled_from(sorted(FORMATS)), st.integers(1, 3), st.sampled_from([8000, 16000, 22050]),
                       st.integers(1, 2500), st.integers(0, 2**32 - 1))


def _samples(channels: int, frames: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, (frames, channels))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=wav_shapes, piped=st.booleans())
def test_wavs_of_every_sample_format_decode_to_their_samples_on_every_path(shape, piped):
    """Oracle: the raw PCM read with numpy by the format's documented scale (u8: (x - 128) / 128;
    s16/s24/s32: x / 2**(bits-1); f32: as is), the same bytes the wave module wrote; the mono
    mix is their mean. A piped WAV (sizes 0xFFFFFFFF) decodes to the same samples."""
    fmt, channels, rate, frames, seed = shape
    pcm = _pcm(fmt, _samples(channels, frames, seed))
    data = _wav(fmt, channels, rate, pcm)
    if piped:
        data = _as_piped(data)
    values = _values(fmt, pcm, channels)
    step = 1 / FORMATS[fmt][1] if fmt != "f32" else 1e-6
    for spec in SPECS:
        audio = _decode(data, spec)
        expected = _expected(values, rate, spec)
        if expected is None:
            assert audio.sample_rate == spec.sample_rate and audio.data.shape[0] == (1 if spec.mono else channels)
            assert abs(audio.data.shape[1] - frames * spec.sample_rate / rate) <= 64
            continue
        assert audio.sample_rate == rate and audio.data.dtype == torch.float32
        assert audio.data.shape == expected.shape, (spec, fmt)
        np.testing.assert_allclose(audio.data.numpy(), expected, rtol=0, atol=step + 1e-6, err_msg=f"{spec} {fmt}")


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=wav_shapes, cut=st.floats(0, 1, exclude_max=True))
def test_a_cut_wav_is_a_decode_error_naming_the_member_under_every_spec(shape, cut):
    """Oracle: the cut itself (the bytes end before the data chunk's size says); cuts fall in
    the header and in the samples. The README's AudioSpec(sample_rate=16000, mono=True) used to
    decode what was there without a word."""
    fmt, channels, rate, frames, seed = shape
    data = _wav(fmt, channels, rate, _pcm(fmt, _samples(channels, frames, seed)))
    end = max(1, int(cut * len(data)))
    for spec in SPECS:
        with pytest.raises(wd.DecodeError) as caught:
            _decode(data[:end], spec, key="cut")
        assert (caught.value.url, caught.value.key, caught.value.field) == ("mem.tar", "cut", "wav")
        if end >= 12:  # a RIFF WAVE it is: our own reading of its chunks says so
            assert "truncated WAV" in str(caught.value), (spec, end, str(caught.value))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=wav_shapes, cut=st.integers(1, 2500), part=st.integers(0, 3))
def test_a_wav_of_unknown_length_decodes_its_whole_frames_and_a_cut_frame_is_an_error(shape, cut, part):
    """Oracle: the first whole frames of the PCM written (numpy, as above). A piped WAV cut
    between frames cannot be told from a shorter one; cut inside a frame, it is truncated."""
    fmt, channels, rate, frames, seed = shape
    pcm = _pcm(fmt, _samples(channels, frames, seed))
    data = _as_piped(_wav(fmt, channels, rate, pcm))
    block = len(pcm) // frames
    kept = min(cut, frames)
    end = len(data) - len(pcm) + kept * block - (part % block if kept > 1 else 0)
    values = _values(fmt, pcm[: kept * block], channels)
    for spec in SPECS:
        if (end - (len(data) - len(pcm))) % block:
            with pytest.raises(wd.DecodeError, match="truncated WAV.*inside a frame"):
                _decode(data[:end], spec)
            continue
        audio = _decode(data[:end], spec)
        expected = _expected(values, rate, spec)
        if expected is not None:
            np.testing.assert_allclose(audio.data.numpy(), expected, rtol=0, atol=2 / FORMATS[fmt][1] + 1e-6)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="needs the ffmpeg command")
@pytest.mark.parametrize(("codec", "raw", "fmt"), [("pcm_u8", "u8", "u8"), ("pcm_s16le", "s16le", "s16"),
                                                   ("pcm_s24le", "s24le", "s24"), ("pcm_s32le", "s32le", "s32"),
                                                   ("pcm_f32le", "f32le", "f32")])
@pytest.mark.parametrize("channels", [1, 2])
def test_wavs_ffmpeg_writes_to_a_pipe_decode_to_ffmpegs_raw_samples(codec, raw, fmt, channels):
    """Oracle: FFmpeg's raw PCM of the same signal (``-f s16le`` etc.), read with numpy.
    ``ffmpeg -f wav -`` writes 0xFFFFFFFF as the sizes (it cannot seek back); such WAVs were
    refused as 134,217 s long."""
    def ffmpeg(*out: str) -> bytes:
        return subprocess.run(["ffmpeg", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=440:r=16000:d=1.5",
                               "-ac", str(channels), "-c:a", codec, *out, "-"], capture_output=True, check=True).stdout

    data, pcm = ffmpeg("-f", "wav"), ffmpeg("-f", raw)
    assert wav_layout(data).streamed and data[4:8] == b"\xff\xff\xff\xff"
    values = _values(fmt, pcm, channels)
    for spec in SPECS:
        audio = _decode(data, spec)
        expected = _expected(values, 16000, spec)
        if expected is not None:
            assert audio.data.shape == expected.shape
            np.testing.assert_allclose(audio.data.numpy(), expected, rtol=0, atol=1e-6)
