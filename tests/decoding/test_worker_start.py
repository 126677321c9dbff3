"""What a loader worker forked after a decoding pipe is built does at its start."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="DataLoader workers by fork: Linux")

# Run in a fresh interpreter: in the test process Pillow's plugins may be registered already.
SCRIPT = textwrap.dedent("""
    import io, json, sys

    import numpy as np
    import PIL.Image
    from torch.utils.data import DataLoader, IterableDataset
    from torch.utils.data.datapipes.iter import IterableWrapper

    import wds_datapipes  # noqa: F401  (registers .decode / .decode_batches)

    def encoded(fmt):
        out = io.BytesIO()
        PIL.Image.fromarray(np.full((12, 10, 3), 90, np.uint8)).save(out, format=fmt)
        return out.getvalue()

    samples = [{"__key__": str(i), "jpg": encoded("JPEG"), "png": encoded("PNG"), "cls": b"1"} for i in range(3)]
    pipes = {"decode": IterableWrapper(samples).decode("torchrgb8"),
             "decode_batches": IterableWrapper(samples).decode_batches("torchrgb8", batch_size=2)}

    class NewModules(IterableDataset):
        def __init__(self, pipe):
            self.pipe = pipe

        def __iter__(self):
            before = set(sys.modules)
            shapes = [list(item["png"].shape) for item in self.pipe]
            yield {"shapes": shapes, "new": sorted(m for m in set(sys.modules) - before if m.startswith("PIL"))}

    out = {name: next(iter(DataLoader(NewModules(pipe), batch_size=None, num_workers=1)))
           for name, pipe in pipes.items()}
    print(json.dumps(out))
""")


@pytest.mark.timeout(120)
def test_a_worker_forked_after_a_decoder_is_built_imports_no_pillow_plugin():
    """Pillow registers its ~50 plugin modules at the first image opened; a decoder registers
    them when it is built, so every worker forked from the process that built it (each epoch
    of a loader without persistent workers forks new ones) decodes without importing them
    again. Oracle: ``sys.modules`` in the worker before and after decoding a JPEG and a PNG."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=110)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["decode"]["shapes"] == [[3, 12, 10]] * 3
    assert out["decode_batches"]["shapes"] == [[2, 3, 12, 10], [1, 3, 12, 10]]
    assert out["decode"]["new"] == [] and out["decode_batches"]["new"] == []
