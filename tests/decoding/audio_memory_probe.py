"""Decodes audio fields one by one and reports how much each raised the peak memory (a JSON
line each). Used by tests/decoding/test_media_memory.py.

    python audio_memory_probe.py LIMIT_BYTES WARM_DIR FIELD:PATH:SPEC...

SPEC is ``audio``, ``mono`` (AudioSpec(mono=True)) or a sample rate and ``mono`` joined by
``-`` (``16000-mono``: AudioSpec(sample_rate=16000, mono=True)). The peak is VmHWM after a
reset of it (/proc/self/clear_refs), less VmRSS before the decode, in a child forked for
each field.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

warnings.filterwarnings("ignore")

import torch
from torch.utils.data.datapipes.iter import IterableWrapper

import wds_datapipes as wd
from wds_datapipes.decoding.media import AudioSpec


def _status(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def _spec(text: str) -> str | AudioSpec:
    if text == "audio":
        return text
    rate, _, mono = text.rpartition("-") if text.endswith("mono") else (text, "", "")
    return AudioSpec(sample_rate=int(rate) if rate else None, mono=bool(mono))


def _decode(field: str, data: bytes, spec: str, limits: wd.Limits) -> torch.Tensor:
    sample = {"__key__": "probe", "__url__": "mem.tar", field: data}
    (decoded,) = IterableWrapper([sample]).decode(_spec(spec), limits=limits)
    return decoded[field].data


def _measure(field: str, path: str, spec: str, limits: wd.Limits, warm: str) -> dict:
    with open(f"{warm}/warm.{field}", "rb") as small:  # a forked child maps the libraries' pages anew
        _decode(field, small.read(), spec, limits)
    with open(path, "rb") as source:
        data = source.read()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    before = _status("VmRSS")
    try:
        out = _decode(field, data, spec, limits)
        outcome = {"shape": list(out.shape), "out_bytes": out.nbytes}
        del out
    except Exception as exn:  # noqa: BLE001 - the report says what it was
        outcome = {"error": type(exn).__name__, "message": str(exn)[:300]}
    return {"peak_rise": _status("VmHWM") - before, **outcome}


def main() -> None:
    """Warms up once (imports, first allocations), then decodes each field in a forked child:
    a fresh heap each, as a fresh process has, without importing torch again."""
    limit, warm, scenarios = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    torch.set_num_threads(1)
    limits = wd.Limits(max_media_bytes=limit, max_media_seconds=1e9)
    for scenario in scenarios:
        field, _, spec = scenario.split(":")
        with open(f"{warm}/warm.{field}", "rb") as small:
            _decode(field, small.read(), spec, limits)
    for scenario in scenarios:
        child = os.fork()
        if child == 0:
            try:
                print(json.dumps({"scenario": scenario, **_measure(*scenario.split(":"), limits, warm)}), flush=True)
            finally:
                os._exit(0)
        os.waitpid(child, 0)


if __name__ == "__main__":
    main()
