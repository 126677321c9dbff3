"""The library on a torch without DataPipes: a stand-in base, and everything but DataLoader2 works.

torch has announced the removal of torch.utils.data.datapipes. The test makes its modules
impossible to import in a fresh interpreter before importing the library (torch's own
DataLoader keeps what it loaded), then runs listers, exact epochs and a StatefulDataLoader
resume under real worker processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from builders import write_index

HIDE_DATAPIPES = textwrap.dedent("""
    import importlib.abc, sys
    import torch
    import torchdata.stateful_dataloader  # loaded first: only this library is to find no DataPipes
    HIDDEN = ("torch.utils.data.datapipes.iter.sharding", "torch.utils.data.graph")

    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name in HIDDEN:
                raise ImportError(f"no module named {name!r} (hidden by the test)")

    for name in HIDDEN:
        sys.modules.pop(name, None)
    sys.meta_path.insert(0, Hide())
""")

SCRIPT = HIDE_DATAPIPES + textwrap.dedent("""
    import json, logging, sys
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    import wds_datapipes as wd
    from torch.utils.data import DataLoader, IterableDataset
    from torchdata.stateful_dataloader import StatefulDataLoader
    assert not wd.torch_datapipes.HAVE_TORCH_DATAPIPES
    index, shards = sys.argv[1], sys.argv[2:]
    out = {}

    lister = wd.ShardLister(shards, shuffle=True, seed=1).load_tar().group_by_key()
    assert isinstance(lister, IterableDataset)
    loader = DataLoader(lister, batch_size=None, num_workers=2)
    epochs = []
    for epoch in range(2):
        loader.dataset.set_epoch(epoch)
        epochs.append([s["__key__"] for s in loader])
    out["lister"] = epochs

    dp = wd.ExactEpochs(index, batch_size=8).batch_samples(8)
    loader = DataLoader(dp, batch_size=None, num_workers=2)
    epochs = []
    for epoch in range(2):
        loader.dataset.set_epoch(epoch)
        epochs.append([k for b in loader for k in b["__key__"]])
    out["exact"] = epochs
    try:
        list(DataLoader(wd.ExactEpochs(index, batch_size=8), batch_size=None, num_workers=2))
        out["unset_epoch"] = "no error"
    except RuntimeError as exn:
        out["unset_epoch"] = str(exn)

    dp = wd.ExactEpochs(index, batch_size=8).batch_samples(8)
    loader = StatefulDataLoader(dp, batch_size=None, num_workers=2)
    loader.dataset.set_epoch(0)
    it = iter(loader)
    head = [k for _ in range(9) for k in next(it)["__key__"]]
    state = loader.state_dict()
    dp2 = wd.ExactEpochs(index, batch_size=8).batch_samples(8)
    loader2 = StatefulDataLoader(dp2, batch_size=None, num_workers=2)
    loader2.load_state_dict(state)
    loader2.dataset.set_epoch(0)
    out["resumed"] = head + [k for b in loader2 for k in b["__key__"]]
    print(json.dumps(out))
""")


def test_without_torch_datapipes_the_pipes_run_under_dataloader_and_stateful_dataloader(tmp_path, sized_shards):
    shards = sized_shards([30, 11, 25, 7])
    index = write_index(shards, tmp_path / "index.json")
    run = subprocess.run([sys.executable, "-c", SCRIPT, index, *shards], capture_output=True, text=True,
                         timeout=300, check=False, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert run.returncode == 0, run.stderr
    import json

    out = json.loads(run.stdout)
    all_keys = sorted(f"u{s}-{i:04d}" for s, n in enumerate([30, 11, 25, 7]) for i in range(n))
    assert [sorted(e) for e in out["lister"]] == [all_keys, all_keys]  # each sample once: workers split shards
    assert out["lister"][0] != out["lister"][1]  # set_epoch reshuffles
    assert [sorted(e) for e in out["exact"]] == [all_keys, all_keys] and out["exact"][0] != out["exact"][1]
    assert "set_epoch" in out["unset_epoch"]
    assert out["resumed"] == out["exact"][0]
    assert run.stderr.count("this torch has no DataPipes") == 1
