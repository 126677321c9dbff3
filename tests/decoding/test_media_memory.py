"""Decoding one audio field near ``Limits.max_media_bytes`` takes at most that much memory, on every path.

Oracle: the process's own peak memory (VmHWM, reset before each decode) in a fresh process,
as tests/test_memory_bounds.py measures it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import pytest

from wds_datapipes.decoding.media import AUDIO_COPIES

PROBE = Path(__file__).with_name("audio_memory_probe.py")
MiB = 1 << 20
LIMIT = 64 * MiB

pytestmark = pytest.mark.skipif(not Path("/proc/self/clear_refs").exists() or shutil.which("ffmpeg") is None,
                                reason="needs Linux's /proc peak-memory counters and the ffmpeg command")


def _wav(path: Path, seconds: float, rate: int, channels: int = 2) -> Path:
    """A 16-bit WAV of a quiet ramp (written in 1 s pieces)."""
    second = bytes(range(256)) * (rate * channels * 2 // 256) + bytes(rate * channels * 2 % 256)
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        whole, part = divmod(int(seconds * rate), rate)
        for _ in range(whole):
            out.writeframes(second)
        out.writeframes(second[: part * channels * 2])
    return path


def _near_limit(copies: float, rate_out: int, channels: int = 2, share: float = 0.95) -> float:
    """Seconds of audio whose decode takes ``share`` of LIMIT under ``copies``."""
    return share * LIMIT / (4 * channels * rate_out * copies)


@pytest.fixture(scope="module")
def fields(tmp_path_factory) -> dict[str, tuple[str, str, float]]:
    """scenario -> (field, path, copies of the output its decode is budgeted)."""
    d = tmp_path_factory.mktemp("audio-memory")
    _wav(d / "warm.wav", 0.5, 16000)
    for suffix in ("flac", "mp3", "opus"):
        subprocess.run(["ffmpeg", "-loglevel", "error", "-i", str(d / "warm.wav"), str(d / f"warm.{suffix}")], check=True)
    ffmpeg, wav, mono = AUDIO_COPIES["ffmpeg"], AUDIO_COPIES["wav"], AUDIO_COPIES["wav"] + 0.5
    flac = _wav(d / "flac.wav", _near_limit(ffmpeg, 16000), 16000)
    for suffix in ("flac", "mp3", "opus"):
        subprocess.run(["ffmpeg", "-loglevel", "error", "-i", str(flac), str(d / f"big.{suffix}")], check=True)
    over = _wav(d / "over.wav", _near_limit(ffmpeg, 16000, share=1.1), 16000)
    subprocess.run(["ffmpeg", "-loglevel", "error", "-i", str(over), str(d / "over.flac")], check=True)
    return {
        "wav:audio": ("wav", str(_wav(d / "a.wav", _near_limit(wav, 16000), 16000)), "audio", wav),
        "wav:mono": ("wav", str(_wav(d / "m.wav", _near_limit(mono, 16000), 16000)), "mono", mono),
        "wav:16000-mono": ("wav", str(_wav(d / "r.wav", _near_limit(ffmpeg + 0.5, 16000), 16000)), "16000-mono",
                           ffmpeg + 0.5),
        "wav:8k-up-16000": ("wav", str(_wav(d / "u.wav", _near_limit(ffmpeg, 16000), 8000)), "16000", ffmpeg),
        "wav:48k-down-16000": ("wav", str(_wav(d / "d.wav", _near_limit(ffmpeg, 16000), 48000)), "16000", ffmpeg),
        "flac:audio": ("flac", str(d / "big.flac"), "audio", ffmpeg),
        "mp3:audio": ("mp3", str(d / "big.mp3"), "audio", ffmpeg),
        "opus:16000": ("opus", str(d / "big.opus"), "16000", ffmpeg),
        "flac:over": ("flac", str(d / "over.flac"), "audio", ffmpeg),
        "warm": ("", str(d), "", 0.0),
    }


def _probe(fields: dict, names: list[str]) -> dict[str, dict]:
    """Each scenario's report; the probe decodes each in a child of its own (a fresh heap: one
    that held the last field's freed frames would hide the next one's peak)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(PROBE), str(LIMIT), fields["warm"][1],
                           *(":".join(fields[name][:3]) for name in names)],
                          env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return dict(zip(names, reports, strict=True))


@pytest.fixture(scope="module")
def reports(fields) -> dict[str, dict]:
    return _probe(fields, [name for name in fields if name != "warm"])


@pytest.mark.timeout(300)
def test_decoding_audio_near_the_limit_takes_at_most_max_media_bytes(fields, reports):
    for name, report in reports.items():
        if name == "flac:over":
            continue
        copies = fields[name][3]
        assert "error" not in report, report
        decoded = report["shape"][1] * 2 * 4  # stereo float32, before a mix to mono
        assert decoded * copies > 0.9 * LIMIT, report  # the field is near the limit
        assert report["peak_rise"] <= LIMIT, (name, report["peak_rise"] / decoded, report)


@pytest.mark.timeout(300)
def test_audio_whose_decode_would_pass_max_media_bytes_is_refused_before_decoding(reports):
    report = reports["flac:over"]
    assert report.get("error") == "DecodeError" and "Limits.max_media_bytes" in report["message"], report
    assert report["peak_rise"] < 8 * MiB, report


if __name__ == "__main__":  # the measurements: peak rise / decoded size, per path
    import tempfile

    class _Factory:
        def mktemp(self, name: str) -> Path:
            return Path(tempfile.mkdtemp(prefix=name))

    made = fields.__wrapped__(_Factory())  # type: ignore[attr-defined]
    for name, report in _probe(made, [n for n in made if n != "warm"]).items():
        decoded = report["shape"][1] * 8 if "shape" in report else 0
        print(name, f"peak {report['peak_rise'] / MiB:.1f} MiB", f"x{report['peak_rise'] / decoded:.2f}" if decoded
              else report.get("message", "")[:120])
