"""The writer encodes bytes, text and integer labels without importing the encoders (torch, Pillow).

An ImageFolder tree's samples hold an int ``cls``: encoding it through the encoders module
imported torch (2-3 s) inside the run, which made such a conversion look several times slower
than a flat folder of the same files.
"""

from __future__ import annotations

import subprocess
import sys
import tarfile

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wds_datapipes.decoding import encoding, values
from wds_datapipes.writing import shard_file

SUFFIXES = ["cls", "CLS", "cls2", "class", "count", "index", "inx", "id", "a.b.cls", "txt", "json", "bin", "jpg",
            "npy", "pyd"]


def test_the_writers_integer_suffixes_are_the_decoders():
    """oracle: decoding.values' own table of integer fields."""
    assert shard_file._DIGITS == set(values._INT)


def _either(encode, suffix, value):
    try:
        return encode(suffix, value, allow_pickle=False)
    except Exception as exn:  # noqa: BLE001 (both must fail alike)
        return type(exn)


@given(suffix=st.sampled_from(SUFFIXES),
       value=st.one_of(st.integers(), st.booleans(), st.text(), st.binary(), st.floats(allow_nan=False),
                       st.lists(st.integers(), max_size=3)))
def test_what_the_writer_encodes_is_what_the_encoders_give(suffix, value):
    """oracle: wds_datapipes.decoding.encoding.encode_value (the encoders' one home), value for value."""
    assert _either(shard_file.encode_value, suffix, value) == _either(encoding.encode_value, suffix, value)


@pytest.mark.timeout(120)
def test_an_imagefolder_tree_is_written_without_importing_torch(tmp_path):
    """oracle: sys.modules of the process that ran ``create``; tarfile reads the labels back."""
    for number, name in enumerate(("cat", "dog")):
        (tmp_path / "tree" / name).mkdir(parents=True)
        for i in range(3):
            (tmp_path / "tree" / name / f"{i}.jpg").write_bytes(bytes([number, i]) * 50)
    script = ("import sys\nfrom wds_datapipes.cli import main\n"
              f"main(['create', {str(tmp_path / 'tree')!r}, '-o', {str(tmp_path / 'out' / 's-%02d.tar')!r}, "
              "'--quiet', '--no-fsync'])\n"
              "print(sorted(m for m in ('torch', 'PIL') if m in sys.modules))")
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=110, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "imagefolder" in run.stderr and run.stdout.strip() == "[]"
    with tarfile.open(tmp_path / "out" / "s-00.tar") as tar:
        labels = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.endswith(".cls")}
    assert labels == {f"{name}/{i}.cls": str(number).encode() for number, name in enumerate(("cat", "dog"))
                      for i in range(3)}
