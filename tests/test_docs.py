"""Every Python block of the README and of docs/ runs, on shards the test writes, or says why not.

A page's blocks run in order in one fresh process (later blocks use what earlier ones
defined), in a folder holding ``data/train-{000000..000099}.tar`` (small JPEGs with a
class) and ``data/index.json`` made by the README's own ``index`` command, and three
indexed sources for the mixing page (``data/web``, ``data/books``, ``data/curated``). A block is
skipped only where the comment before it says so: ``<!-- not run: REASON -->``, or
``<!-- run: needs MODULE -->`` where that module cannot be imported (DataLoader2 on the
newest stack).
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
MARKER = re.compile(r"<!--\s*(not run|run):\s*(.*?)\s*-->")


@dataclass
class Block:
    page: Path
    line: int  # of the fence
    code: str
    marker: tuple[str, str] | None


def blocks(page: Path) -> list[Block]:
    found, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i
            i += 1
            body = []
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            before = next((lines[j] for j in range(start - 1, -1, -1) if lines[j].strip()), "")
            match = MARKER.search(before)
            code = textwrap.dedent("\n".join(body)) + "\n"  # a block in a list item is indented
            found.append(Block(page, start + 1, code, match.groups() if match else None))
        i += 1
    return found


RUNNER = r'''
import importlib.util, json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
ran = skipped = 0
for block in blocks:
    marker = block["marker"]
    if marker and marker[0] == "not run":
        skipped += 1
        continue
    if marker and marker[1].startswith("needs "):
        if importlib.util.find_spec(marker[1].split()[1].split(".")[0]) is None or \
                importlib.util.find_spec(marker[1].split()[1]) is None:
            print(f"skipped {block['where']}: {marker[1]}")
            skipped += 1
            continue
    try:
        exec(compile(block["code"], block["where"], "exec"), namespace)
    except Exception:
        traceback.print_exc()
        print(f"FAILED: the block at {block['where']}")
        sys.exit(1)
    ran += 1
print(json.dumps({"ran": ran, "skipped": skipped}))
'''


def _jpeg(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(out, format="JPEG", quality=90)
    return out.getvalue()


@pytest.fixture(scope="module")
def docs_data(tmp_path_factory) -> Path:
    """The shards the docs name, and the index the README's command makes of them."""
    root = tmp_path_factory.mktemp("docs")
    (root / "data").mkdir()
    rng = np.random.default_rng(0)
    for shard in range(100):
        with wds.TarWriter(str(root / "data" / f"train-{shard:06d}.tar")) as writer:
            for i in range(4):
                writer.write({"__key__": f"s{shard:03d}-{i}", "jpg": _jpeg(rng), "cls": str((shard + i) % 10)})
    command = [sys.executable, "-m", "wds_datapipes", "index", "data/train-{000000..000099}.tar", "--places",
               "-o", "data/index.json"]
    subprocess.run(command, cwd=root, check=True, capture_output=True, timeout=120)
    for name, shards, per_shard in (("web", 10, 30), ("books", 4, 25), ("curated", 1, 20)):  # docs/mixing.md's
        (root / "data" / name).mkdir()
        for shard in range(shards):
            with wds.TarWriter(str(root / "data" / name / f"{name}-{shard:04d}.tar")) as writer:
                for i in range(per_shard):
                    writer.write({"__key__": f"{name}{shard}-{i}", "jpg": _jpeg(rng), "cls": str(i % 10)})
        command = [sys.executable, "-m", "wds_datapipes", "index", f"data/{name}/", "-o", f"data/{name}/index.json"]
        subprocess.run(command, cwd=root, check=True, capture_output=True, timeout=120)
    _speech_shards(root / "data", rng)
    return root


def _speech_shards(data: Path, rng: np.random.Generator) -> None:
    """docs/media.md's ``data/speech-{000000..000001}.tar``: flac tones of 0.5-1.5 s and a transcript
    (where TorchCodec can encode them; its page's block needs it anyway)."""
    try:
        import torch
        from torchcodec.encoders import AudioEncoder
    except (ImportError, RuntimeError, OSError):
        return
    for shard in range(2):
        with wds.TarWriter(str(data / f"speech-{shard:06d}.tar")) as writer:
            for i in range(10):
                seconds = rng.uniform(0.5, 1.5)
                t = torch.arange(int(seconds * 22050)) / 22050
                tone = 0.3 * torch.sin(2 * np.pi * 220 * (1 + i) * t).repeat(2, 1)
                flac = AudioEncoder(tone, sample_rate=22050).to_tensor("flac").numpy().tobytes()
                writer.write({"__key__": f"utt{shard}-{i}", "flac": flac, "txt": f"tone {i}"})


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_the_python_blocks_of_a_page_run(page, docs_data, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    os.symlink(docs_data / "data", work / "data")
    found = blocks(page)
    spec = [{"code": b.code, "marker": b.marker, "where": f"{page.relative_to(ROOT)}:{b.line}"} for b in found]
    (tmp_path / "blocks.json").write_text(json.dumps(spec))
    (tmp_path / "runner.py").write_text(RUNNER)
    run = subprocess.run([sys.executable, str(tmp_path / "runner.py"), str(tmp_path / "blocks.json")], check=False,
                         cwd=work,
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts["ran"] + counts["skipped"] == len(found)
    assert counts["ran"] >= 1


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_a_block_that_does_not_run_says_why(page):
    for block in blocks(page):
        if block.marker is None:
            continue
        kind, reason = block.marker
        assert reason, f"{page.name}:{block.line}: a block marked '{kind}' gives no reason"
        if kind == "run":
            assert re.fullmatch(r"needs [\w.]+", reason), f"{page.name}:{block.line}: 'run:' takes 'needs MODULE'"


def test_the_block_reader_sees_markers_and_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- not run: needs a cluster -->\n```python\nx = 1\n```\n\n```python\ny = 2\n```\n")
    first, second = blocks(page)
    assert first.marker == ("not run", "needs a cluster") and first.code == "x = 1\n" and first.line == 4
    assert second.marker is None and second.code == "y = 2\n"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_wd_name_a_page_shows_exists(page):
    import wds_datapipes as wd

    names = set(re.findall(r"\bwd\.([A-Za-z_]\w*)", page.read_text()))
    missing = sorted(name for name in names if name not in wd.__all__ and not hasattr(wd, name))
    assert missing == [], f"{page.name} shows wd.{missing}, which the package does not have"
