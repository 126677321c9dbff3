"""The benchmarks: ours against the peers and the bare loops, on the same data, in one run.

Run one from the checkout as a module; ``--quick`` (tiny data, one round) proves it runs
end to end, and ``--help`` lists its options::

    python -m benchmarks.bench_write [--rounds 9] [--quick]

Each writes its full output, after a header (machine, versions, date, commit, command),
into ``benchmarks/results/<bench>-<date>.txt``, and the ratios it states into a ``.json``
beside it (docs/speed.md: how to run and read them).

The layers, bottom up (imports only go down; ``tests/test_layout.py`` checks):

- ``harness/``: rounds, pairing, medians, ratios and the results file (its docstring is
  the API a new benchmark uses).
- What the benchmarks share: ``shards`` (the data, written once), ``vision_loops`` (the bare
  loop, ours and webdataset's recipe for the vision rows), ``front_doors`` (every front door
  beside the peers on 2 cores), ``raw_reading`` (the raw rows' ceiling, floor and LitData
  copy), ``worker_loaders`` (2-worker loaders that tally, and the CPU meters of workers and
  cluster nodes), ``storage_setup`` (the object-store objects, environment and URLs),
  ``storage_pipelines``, ``storage_places``, ``storage_in_process`` (bench_storage's parts)
  and ``storage_clients`` (the per-client worker process it starts).
- The benchmarks, ``bench_*`` (``make bench``, ``bench-write``, ``bench-storage``,
  ``bench-cache``, ``bench-ais``, ``bench-media``, ``bench-nodes``, ``bench-epochs``), and
  the probes, ``probe_*``, which take one path apart (where a worker's time goes) rather
  than compare libraries. Nothing imports a benchmark or a probe.

This package is part of the checkout, not of the wheel: nothing here is imported by
``wds_datapipes`` or ``aisio``, and this file imports nothing (``storage_clients`` runs in a
venv that has only one S3 client).
"""
