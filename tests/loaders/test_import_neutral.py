"""Importing wds_datapipes changes nothing for pipelines without its pipes, and costs them nothing.

torch's and torchdata's own DataPipe examples run in fresh processes with and without
``import wds_datapipes`` (oracle: the same program without the import): their items,
their loaders' checkpoints and resumes, and which of ``set_epoch`` / ``state_dict`` /
``load_state_dict`` the pipes answer must be the same. Then the per-batch cost of a
checkpoint: no walk (pickling) of the graph per batch, and a state that does not grow
with the graph's data.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest
import torch
from stack import needs_dataloader2

import wds_datapipes as wd
from wds_datapipes.torch_datapipes import HAVE_TORCH_DATAPIPES

needs_torch_datapipes = pytest.mark.skipif(not HAVE_TORCH_DATAPIPES, reason="this torch has no DataPipes")

PROGRAM = textwrap.dedent("""
    import json, sys, warnings
    import torch
    from torch.utils.data import DataLoader, IterableDataset
    from torchdata.stateful_dataloader import StatefulDataLoader
    if sys.argv[1] == "import":
        import wds_datapipes  # noqa: F401
    part = sys.argv[2]
    out = {}

    def hooks(obj):
        found = {}
        for name in ("set_epoch", "state_dict", "load_state_dict"):
            found[name] = hasattr(obj, name)
            if name == "set_epoch" and found[name]:
                obj.set_epoch(1)  # present: it must not raise
        return found

    def resumed(make, workers, stop=3):
        torch.manual_seed(0)
        loader = make(workers)
        it = iter(loader)
        head = [next(it) for _ in range(stop)]
        state = loader.state_dict()
        again = make(workers)
        again.load_state_dict(state)
        return {"head": repr(head), "rest": repr(list(again)), "state": repr(state)}

    if part == "datapipes":
        from torch.utils.data.datapipes.iter import IterableWrapper

        def double(x):
            return 2 * x

        def odd(x):
            return x % 3 != 0

        def pipeline():
            return IterableWrapper(range(60)).map(double).filter(odd).shuffle().sharding_filter().batch(4)

        out["hooks"] = hooks(pipeline())
        for workers in (0, 2):
            loader = DataLoader(pipeline(), batch_size=None, num_workers=workers,
                                generator=torch.Generator().manual_seed(1))
            out[f"hooks-dataset-{workers}"] = hooks(loader.dataset)
            out[f"DataLoader-{workers}"] = repr([list(loader) for _ in range(2)])
            make = lambda w: StatefulDataLoader(pipeline(), batch_size=None, num_workers=w,
                                                generator=torch.Generator().manual_seed(1))
            out[f"StatefulDataLoader-{workers}"] = resumed(make, workers)
            out[f"hooks-stateful-{workers}"] = hooks(make(workers).dataset)
        out["direct"] = repr([list(pipeline()) for _ in range(2)])

    if part == "dataloader2":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from torchdata.datapipes.iter import IterableWrapper
            from torchdata.dataloader2 import DataLoader2, MultiProcessingReadingService

        def square(x):
            return x * x

        dp = IterableWrapper(range(40)).shuffle().sharding_filter().map(square).batch(5)
        out["hooks"] = hooks(dp)
        loader = DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2))
        loader.seed(3)
        out["DataLoader2"] = repr([sorted(map(tuple, loader)) for _ in range(2)])
        loader.shutdown()

    if part == "dataset":  # a plain IterableDataset: every stack has these
        class Numbers(IterableDataset):
            def __iter__(self):
                info = torch.utils.data.get_worker_info()
                start, step = (info.id, info.num_workers) if info else (0, 1)
                return iter(range(start, 50, step))

        for workers in (0, 2):
            out[f"DataLoader-{workers}"] = repr(list(DataLoader(Numbers(), batch_size=4, num_workers=workers)))
            make = lambda w: StatefulDataLoader(Numbers(), batch_size=4, num_workers=w)
            out[f"StatefulDataLoader-{workers}"] = resumed(make, workers)
        out["hooks"] = hooks(Numbers())
    print(json.dumps(out))
""")


def _run(with_import: bool, part: str) -> dict:
    run = subprocess.run([sys.executable, "-c", PROGRAM, "import" if with_import else "plain", part],
                         capture_output=True, text=True, timeout=240, check=False,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)


@pytest.mark.parametrize("part", [
    pytest.param("datapipes", marks=needs_torch_datapipes),
    pytest.param("dataloader2", marks=needs_dataloader2),
    "dataset",
])
def test_torch_and_torchdata_examples_run_the_same_with_and_without_the_import(part):
    plain, imported = _run(False, part), _run(True, part)
    assert imported == plain
    assert not any(plain[key].get("set_epoch") for key in plain if key.startswith("hooks"))


# ---------------------------------------------------------------- what a checkpoint costs per batch


def _identity(x):
    return x


@pytest.fixture
def graph_walks(monkeypatch):
    """Counts torch's walks of a DataPipe graph (each pickles every pipe's data); on a torch
    without DataPipes, the library's walks of its stand-in graphs."""
    if HAVE_TORCH_DATAPIPES:
        from torch.utils.data import graph as module

        name = "_list_connected_datapipes"
    else:
        from wds_datapipes.loaders import hooks as module

        name = "walk_graph"
    calls = []
    original = getattr(module, name)

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counting)
    return calls


def _checkpoint_every_batch(loader, batch_iter, batches: int) -> list[bytes]:
    """Takes ``batches`` batches, with a checkpoint after each, as StatefulDataLoader's workers make one."""
    states = []
    for _ in range(batches):
        next(batch_iter)
        states.append(pickle.dumps(loader.state_dict()))
    return states


@needs_torch_datapipes
def test_a_plain_pipelines_checkpoint_does_not_walk_its_graph_per_batch(graph_walks):
    from torch.utils.data.datapipes.iter import IterableWrapper
    from torchdata.stateful_dataloader import StatefulDataLoader

    dp = IterableWrapper(list(range(200_000))).map(_identity).batch(100)
    loader = StatefulDataLoader(dp, batch_size=None, num_workers=0)
    batches = iter(loader)  # torch walks the graph here, to seed and split it
    _checkpoint_every_batch(loader, batches, 3)
    walks = len(graph_walks)
    _checkpoint_every_batch(loader, batches, 30)
    assert len(graph_walks) == walks  # none per batch
    assert not hasattr(loader.dataset, "state_dict")  # nothing of ours: StatefulDataLoader's own checkpoint


def _lister_states(n_urls: int, graph_walks: list) -> list[bytes]:
    from torchdata.stateful_dataloader import StatefulDataLoader

    urls = [f"mem://many/shard-{i:06d}.tar" for i in range(n_urls)]
    dp = wd.ShardLister(urls, shuffle=True, seed=0)
    loader = StatefulDataLoader(dp, batch_size=10, num_workers=0, generator=torch.Generator().manual_seed(0))
    batches = iter(loader)
    states = _checkpoint_every_batch(loader, batches, 2)
    walks = len(graph_walks)
    states += _checkpoint_every_batch(loader, batches, 20)
    assert len(graph_walks) == walks  # none per batch
    return states


def test_a_shard_listers_checkpoint_is_small_and_walks_nothing_per_batch(graph_walks):
    few, many = _lister_states(1_000, graph_walks), _lister_states(100_000, graph_walks)
    assert max(map(len, many)) < 2_000  # the state holds no URL
    assert [len(s) for s in many] == [len(s) for s in few]  # and does not grow with their number


# ---------------------------------------------------------------- which pipelines have the hooks


def _hook_names(dp) -> set[str]:
    return {name for name in ("set_epoch", "state_dict", "load_state_dict") if hasattr(dp, name)}


@needs_torch_datapipes
def test_the_hooks_are_on_pipelines_whose_pipes_of_ours_draw_per_epoch_orders_only():
    from torch.utils.data.datapipes.iter import IterableWrapper

    samples = [{"__key__": f"k{i}", "txt": b"x"} for i in range(6)]
    assert _hook_names(IterableWrapper(samples).map(_identity).batch(2)) == set()
    assert _hook_names(IterableWrapper(samples).decode().batch(2)) == set()  # ours, but it draws nothing
    shuffled = IterableWrapper(samples).shuffle_samples(4, seed=1).map(_identity).batch(2)
    assert _hook_names(shuffled) == {"set_epoch", "state_dict", "load_state_dict"}
    assert _hook_names(wd.ShardLister(["a.tar"]).map(_identity)) == {"set_epoch", "state_dict", "load_state_dict"}


@needs_torch_datapipes
def test_set_epoch_where_nothing_listens_does_nothing_and_says_so_at_debug(caplog):
    from torch.utils.data.datapipes.iter import IterableWrapper

    from wds_datapipes.loaders.hooks import pipeline_set_epoch

    dp = IterableWrapper(range(4)).batch(2)
    with caplog.at_level("DEBUG", logger="wds_datapipes"):
        pipeline_set_epoch(dp, 3)
    assert list(dp) == [[0, 1], [2, 3]]
    assert "nothing upstream draws per-epoch orders" in caplog.text
