"""One ETL definition, two places to run it: the reading worker (etl_local=) and the cluster.

The local cluster cannot run ETLs (AIStore runs them on Kubernetes only), so the cluster
path is tested up to what the cluster receives, and the "same bytes" claim by running the
class the way AIStore's Python runtime does (its own server process, fed like a target
feeds it) next to the local path.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from ais_helpers import reference_samples
from etl_transforms import AddToClass, EchoRequest, Failing, Passthrough
from faulty_proxy import FaultyRelay
from server_process import free_port
from stack import two_worker_loader

from aisio import AISSourceLister, ETLError, open_ais_url
from aisio.client import ENDPOINT_ENV
from aisio.etl import init_etl_class
from wds_datapipes import ShardOpenError

HERE = Path(__file__).parent


def _with_cls_added(samples: list[dict], add: int) -> list[dict]:
    return [{**s, "cls": str(int(s["cls"]) + add).encode()} for s in samples]


def test_etl_local_runs_the_etl_class_in_each_worker_and_the_urls_say_so(dataset):
    bucket, paths, _ = dataset
    lister = AISSourceLister(f"ais://{bucket}/train-", etl_args={"add": 10}, etl_local=AddToClass)
    assert lister.etl_name == "AddToClass"
    dp = lister.load_tar().group_by_key()
    with two_worker_loader(dp) as loader:
        got = list(loader)
    want = _with_cls_added(reference_samples(paths), 10)
    assert sorted((strip(s) for s in got), key=lambda s: s["__key__"]) == sorted(want, key=lambda s: s["__key__"])
    # Each sample's URL says where its bytes were transformed: here (etl_local=...).
    assert all("etl_local=etl_transforms%3AAddToClass" in s["__url__"] for s in got)


def strip(sample: dict) -> dict:
    return {k: v for k, v in sample.items() if k != "__url__"}


def test_etl_local_requests_carry_no_etl_to_the_cluster(dataset, monkeypatch):
    bucket, paths, _ = dataset
    with FaultyRelay(os.environ[ENDPOINT_ENV], cut_after=0, cuts=0) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        lister = AISSourceLister(f"ais://{bucket}/train-00000[01].tar", etl_name="add", etl_args={"add": 1},
                                 etl_local=AddToClass)
        got = [strip(s) for s in lister.load_tar().group_by_key()]
    assert got == _with_cls_added(reference_samples(paths[:2]), 1)
    gets = [q for entry, q in zip(relay.log, relay.queries) if entry[1].startswith("/v1/objects/")]
    assert gets and not any("etl" in q for q in gets)


@pytest.fixture
def etl_server_process(ais_endpoint):
    """Runs an ETL class as AIStore's runtime does: its own process, ``start()`` serving HTTP."""
    procs = []

    def start(cls_name: str) -> str:
        port = free_port()
        code = f"from etl_transforms import {cls_name}; {cls_name}(host='127.0.0.1', port={port}).start()"
        env = dict(os.environ, AIS_TARGET_URL=ais_endpoint, PYTHONPATH=f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        procs.append(subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1) as resp:
                    if resp.read() == b"Running":
                        return url
            except OSError:
                assert time.monotonic() < deadline, "the ETL server did not start"
                time.sleep(0.1)

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=30)


def _as_a_target_sends_it(server: str, bucket: str, name: str, body: bytes, etl_args: str) -> bytes:
    # hpush: PUT <server>/<bucket>/<object>?etl_args=... with the object's bytes (ext/etl/communicator.go).
    query = urllib.parse.urlencode({"etl_args": etl_args})
    req = urllib.request.Request(f"{server}/{bucket}/{name}?{query}", data=body, method="PUT")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.read()


def test_the_same_class_gives_the_same_bytes_in_the_worker_and_as_an_etl_server(dataset, etl_server_process):
    bucket, paths, _ = dataset
    name = os.path.basename(paths[0])
    data = Path(paths[0]).read_bytes()
    for cls, args in ((AddToClass, '{"add":7}'), (EchoRequest, '{"size":224}'), (Passthrough, "")):
        served = _as_a_target_sends_it(etl_server_process(cls.__name__), bucket, name, data, args)
        lister = AISSourceLister(f"ais://{bucket}/{name}", etl_name=cls.__name__, etl_args=args or None, etl_local=cls)
        (url,) = list(lister)
        with open_ais_url(url) as stream:
            local = stream.read()
        assert local == served, cls.__name__
    echoed = _as_a_target_sends_it(etl_server_process("EchoRequest"), bucket, name, data, "x")
    assert json.loads(echoed) == {"path": f"/{bucket}/{name}", "etl_args": "x", "size": len(data)}


def test_etl_local_output_can_start_mid_stream(dataset):
    bucket, paths, _ = dataset
    name = os.path.basename(paths[0])
    data = Path(paths[0]).read_bytes()
    (url,) = list(AISSourceLister(f"ais://{bucket}/{name}", etl_local=Passthrough))
    with open_ais_url(url, start=70_000) as stream:
        assert stream.read() == data[70_000:]


def test_a_failing_local_transform_names_the_class_the_object_and_the_cause(dataset):
    bucket, paths, _ = dataset
    name = os.path.basename(paths[0])
    (url,) = list(AISSourceLister(f"ais://{bucket}/{name}", etl_local=Failing))
    with pytest.raises(ShardOpenError, match=rf"ETL class etl_transforms:Failing .*ais://{bucket}/{name} failed: "
                                             r"RuntimeError: model weights not found"):
        open_ais_url(url)
    with pytest.raises(TypeError, match="ETLServer subclass"):
        AISSourceLister(f"ais://{bucket}/{name}", etl_local=dict)


def test_deploying_the_class_on_a_cluster_without_etl_names_the_etl_and_the_answer(ais_endpoint, monkeypatch):
    with FaultyRelay(ais_endpoint, cut_after=0, cuts=0) as relay:
        monkeypatch.setenv(ENDPOINT_ENV, relay.url)
        with pytest.raises(ETLError, match=r"cannot init ETL 'add-to-class' from class AddToClass on .*HTTP 501"):
            init_etl_class("add-to-class", AddToClass)
    assert [(m, p) for m, p, *_ in relay.log] == [("PUT", "/v1/etl")]  # the class went to the cluster's ETL API
