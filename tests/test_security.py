"""Hostile shards and names: nothing found on disk or inside a shard runs a program."""

from __future__ import annotations

import http.server
import io
import logging
import os
import pickle
import socket
import tarfile
import threading
from pathlib import Path

import PIL.EpsImagePlugin
import pytest
import webdataset as wds
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from torch.utils.data.datapipes.iter import IterableWrapper

from wds_datapipes import (
    DecodeError,
    ShardFormatError,
    ShardLister,
    ShardOpenError,
    ShardReadError,
    WdsError,
    warn_and_continue,
)
from wds_datapipes.shards.openers import url_scheme

# The name of a file a hostile dataset ships: read as a URL, it is a shell command.
PIPE_NAME = "pipe:touch pwned #.tar"


def _write_shard(path: Path, n: int = 2) -> None:
    with wds.TarWriter(str(path)) as writer:
        for i in range(n):
            writer.write({"__key__": f"k{i}", "cls": str(i).encode()})


@pytest.fixture
def hostile_dir(tmp_path, monkeypatch) -> Path:
    """The current folder, holding a real shard whose file name is a ``pipe:`` command."""
    data = tmp_path / "data"
    data.mkdir()
    _write_shard(data / PIPE_NAME)
    _write_shard(data / "a.tar", 1)
    monkeypatch.chdir(data)  # relative globs return the bare name; `touch pwned` would write here
    return data


@pytest.mark.parametrize("spec", ["*.tar", "[ap]*.tar", "p*", ".", "file://*.tar", "{d}/*.tar"])
def test_a_shard_found_on_disk_named_like_a_pipe_is_read_as_a_file(hostile_dir, spec):
    samples = list(ShardLister(spec.format(d=hostile_dir)).load_tar().group_by_key())
    assert not (hostile_dir / "pwned").exists()
    urls = sorted({s["__url__"] for s in samples})
    assert all(type(u) is str and url_scheme(u) == "file" for u in urls)  # a plain str that reopens the file
    names = sorted(os.path.basename(u) for u in urls)
    assert names == ([PIPE_NAME] if spec == "p*" else ["a.tar", PIPE_NAME])
    assert len(samples) == sum({"a.tar": 1, PIPE_NAME: 2}[n] for n in names)


def test_a_found_path_stays_a_file_through_pickling_to_workers(hostile_dir):
    import pickle

    (found,) = ShardLister("p*.tar")
    assert found == PIPE_NAME
    clone = pickle.loads(pickle.dumps(found))
    assert clone == found and url_scheme(clone) == "file"


def test_a_pipe_url_the_user_writes_still_runs(tmp_path, monkeypatch):
    shard = tmp_path / "s.tar"
    _write_shard(shard)
    monkeypatch.chdir(tmp_path)
    samples = list(ShardLister([f"pipe:cat {shard}"]).load_tar().group_by_key())
    assert [s["__key__"] for s in samples] == ["k0", "k1"]


# ---------------------------------------------------------------- images: formats by suffix, no Ghostscript

EPS = b"""%!PS-Adobe-3.0 EPSF-3.0
%%BoundingBox: 0 0 8 8
newpath 0 0 moveto 8 0 lineto 8 8 lineto closepath fill
showpage
%%EOF
"""


@pytest.fixture
def fake_ghostscript(tmp_path, monkeypatch) -> Path:
    """A ``gs`` first on PATH that records each run in a file (and then fails)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = tmp_path / "gs-runs"
    script = bin_dir / "gs"
    script.write_text(f'#!/bin/sh\necho "$@" >> {runs}\nexit 1\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(PIL.EpsImagePlugin, "gs_binary", None)  # Pillow caches its probe
    return runs


def _decode(sample: dict, *specs, **options) -> dict:
    return next(iter(IterableWrapper([sample]).decode(*specs, **options)))


@pytest.mark.parametrize("spec", ["pil", "rgb8", "torchrgb8"])
def test_eps_bytes_in_a_jpg_field_never_start_ghostscript(fake_ghostscript, spec):
    sample = {"__key__": "k", "__url__": "u.tar", "jpg": EPS}
    with pytest.raises(DecodeError, match="'jpg'"):
        _decode(sample, spec)
    assert not fake_ghostscript.exists()


def test_an_eps_field_is_refused_unless_eps_is_named(fake_ghostscript):
    sample = {"__key__": "k", "__url__": "u.tar", "eps": EPS}
    with pytest.raises(DecodeError, match="image_formats"):
        _decode(sample, "pil")
    assert not fake_ghostscript.exists()
    with pytest.raises(DecodeError):  # our fake gs fails, but it was asked for by name
        _decode(sample, "rgb8", image_formats=["EPS"])
    assert fake_ghostscript.exists()


def _png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (4, 3), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


def test_an_image_is_opened_only_as_the_format_its_suffix_names():
    png = _png_bytes()
    assert _decode({"__key__": "k", "png": png}, "rgb8")["png"].shape == (3, 4, 3)
    with pytest.raises(DecodeError, match="'jpg'"):
        _decode({"__key__": "k", "jpg": png}, "rgb8")
    widened = _decode({"__key__": "k", "jpg": png}, "rgb8", image_formats=["JPEG", "PNG"])
    assert widened["jpg"].shape == (3, 4, 3)


def test_unknown_image_format_names_are_refused_when_the_pipe_is_built():
    with pytest.raises(ValueError, match="unknown image formats"):
        IterableWrapper([]).decode("rgb8", image_formats=["NOPE"])
    with pytest.raises(TypeError, match="list of Pillow format names"):
        IterableWrapper([]).decode("rgb8", image_formats="JPEG")


def test_pickle_fields_are_not_unpickled_by_default():
    import pickle

    sample = {"__key__": "k", "__url__": "u.tar", "pkl": pickle.dumps({"a": 1})}
    with pytest.raises(DecodeError, match="allow_pickle"):
        _decode(sample)


# ---------------------------------------------------------------- HTTP redirects and member names


class _Redirect(http.server.BaseHTTPRequestHandler):
    target = ""

    def do_GET(self):
        self.send_response(302)
        self.send_header("Location", self.target)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("target", ["file:///etc/passwd", PIPE_NAME])
def test_an_http_redirect_to_a_file_or_pipe_is_refused(tmp_path, monkeypatch, target):
    for name in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    handler = type("Handler", (_Redirect,), {"target": target})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/shard.tar"
        with pytest.raises(ShardOpenError, match="shard.tar") as caught:
            list(ShardLister([url]).load_tar())
        assert caught.value.url == url
    finally:
        server.shutdown()
        server.server_close()
    assert not (tmp_path / "pwned").exists()


def test_member_names_are_only_strings(tmp_path, monkeypatch):
    shard = tmp_path / "names.tar"
    names = ["../../escape.txt", "/abs/olute.txt", "pipe:touch pwned #.txt", "ok.txt"]
    with tarfile.open(shard, "w") as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = 1
            tar.addfile(info, io.BytesIO(b"x"))
    workdir = tmp_path / "a" / "b"
    workdir.mkdir(parents=True)
    monkeypatch.chdir(workdir)
    samples = list(ShardLister([str(shard)]).load_tar().group_by_key().decode())
    assert [s["__key__"] for s in samples] == ["../../escape", "/abs/olute", "pipe:touch pwned #", "ok"]
    assert all(s["txt"] == "x" for s in samples)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "names.tar"]


# Secrets a URL or a command line may carry: none of them shows in an error or a log line.
_secrets = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", min_size=12,
                   max_size=40)
_passwords = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789%-._~", min_size=12,
                     max_size=40)  # a URL's user part, percent-encoded


@settings(max_examples=200, deadline=None)
@given(password=_passwords, signature=_secrets, token=_secrets,
       parameter=st.sampled_from(["X-Amz-Signature", "X-Amz-Credential", "X-Amz-Security-Token", "X-Goog-Signature",
                                  "sig", "access_token", "key"]))
def test_no_secret_of_a_url_or_command_shows_in_an_error(password, signature, token, parameter):
    """Oracle: the secrets themselves, drawn at random: none is a substring of the message,
    while the host, path and plain parameters it names stay readable."""
    url = f"https://alice:{password}@data.example.com/train/shard-000001.tar?{parameter}={signature}&part=7"
    command = f"pipe:curl -s -H 'Authorization: Bearer {token}' '{url}'"
    for error in (ShardOpenError(url, "403 Forbidden"), ShardReadError(url, "a.jpg", 512, "reset"),
                  ShardFormatError(command, None, 0, "truncated tar header"), DecodeError(url, "k", "jpg", "bad")):
        for shown in (str(error), str(pickle.loads(pickle.dumps(error)))):
            assert password not in shown and signature not in shown and token not in shown
            assert "data.example.com/train/shard-000001.tar" in shown and "part=7" in shown
    plain = "https://h/a.tar?design=1&keyframe=2&monkey=3"  # names that merely contain "sig" or "key"
    assert str(ShardOpenError(plain, "gone")) == f"cannot open shard {plain!r}: gone"


def test_a_failing_read_of_a_url_with_secrets_shows_none_in_the_error_or_the_log(caplog):
    """A real failure through the HTTP opener and a pipe: command: the secret is in neither
    the raised error nor the log line that warn_and_continue writes."""
    secret = "S3cr3tSignatureValue0123456789"
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    urls = [f"http://bob:{secret}@127.0.0.1:{port}/a.tar?X-Amz-Signature={secret}",
            f"pipe:sh -c 'exit 3' 'https://h/a.tar?sig={secret}'"]
    for url in urls:
        with pytest.raises(WdsError) as raised:
            list(ShardLister([url]).load_tar())
        assert secret not in str(raised.value)
    with caplog.at_level(logging.INFO, logger="wds_datapipes"), pytest.warns(UserWarning) as warned:
        assert list(ShardLister(urls).load_tar(handler=warn_and_continue)) == []
    assert caplog.records and all(secret not in r.getMessage() for r in caplog.records)
    assert all(secret not in str(w.message) for w in warned)
