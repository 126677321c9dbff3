"""Every name of the flat layout's modules still resolves at its old path (docs/layout.md's promise)."""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

from wds_datapipes import _moved

# Oracle: the public names of each module of wds_datapipes/ at the commit before the rooms
# (bbc07ad~1, "The house: rooms by concern" is bbc07ad): what each defined at its top level,
# and what it imported from the package's other modules, which code could take from it.
# Listed by `git show bbc07ad~1:wds_datapipes/<module>.py` and an ast walk of its top level.
OLD_NAMES = {
    "allocator": "keep_freed_memory logger",
    "batch_decoding": (
        "BatchDecoder DecodeError EXACT_EPOCH_FLAG EpochClock Handler IMAGE_EXTENSIONS IMAGE_SPECS "
        "ImageHandler IterDataPipe Limits Pipe SampleDecoder Spec check_positive chunks collate "
        "decode_jpeg_into decode_transform_into functional_datapipe jpeg_into_buffer_shape "
        "reraise_exception worker_threads"
    ),
    "batching": "Batcher IterDataPipe Pipe check_positive chunks collate functional_datapipe stack_tensors",
    "cli": (
        "ShardIndex ShardPlaces ShardScan WdsError build_index check_scan_against expand_url_spec "
        "expand_urls group_members iter_tar_members main open_shard resolve_local scan_shard url_scheme"
    ),
    "dataloader2_fix": "SUPPORTED_TORCHDATA install logger reading_service_class uninstall",
    "decoding": (
        "CallableHandler DecodeError Decoder EXTERNAL_PROGRAM_FORMATS Handler IMAGE_EXTENSIONS "
        "IMAGE_SPECS ImageHandler ImageSpec IterDataPipe Limits PICKLE_EXTENSIONS PatternHandler Pipe "
        "SampleDecoder Spec check_image_pixels check_positive compile_spec decode_image decode_jpeg_into "
        "functional_datapipe get_limits image_formats_for jpeg_into_buffer_shape ordered_map "
        "reraise_exception safe_image_formats skips worker_threads"
    ),
    "epoch_plan": (
        "EpochPlan MODES PlanSettings ReaderPlan Segment Span SpanList Split epoch_sequence next_worker "
        "pass_sequence plan_epoch rank_batches remaining_sequence shard_order split_epoch worker_batches "
        "worker_sizes"
    ),
    "epoch_state": (
        "EpochState FORMAT PlanSettings ResumePoint Segment check_settings epoch_finished next_worker "
        "plan_epoch resume_point worker_batches"
    ),
    "errors": (
        "DecodeError IndexMismatchError NoShardsError STREAM_FAILURES SampleError ShardFormatError "
        "ShardOpenError ShardReadError WdsError shard_error"
    ),
    "exact_epochs": (
        "EXACT_EPOCH_FLAG EpochClock EpochPlan EpochState ExactEpochs HAVE_TORCH_DATAPIPES "
        "IndexMismatchError IterDataPipe Limits PAD_KEY Pipe PlanSettings ReaderPlan ResumePoint "
        "ShardIndex ShardUrl ShardingRecord Span SpanList Topology check_settings epoch_finished "
        "get_limits group_members iter_tar_members loader_worker logger open_shard "
        "pipeline_load_state_dict pipeline_set_epoch pipeline_state_dict plan_epoch read_placed "
        "read_share resume_point shuffled_by_places span_samples split_key stream_size traverse_dps"
    ),
    "fields": (
        "FieldMapper Handler IterDataPipe KeyRenamer Pipe SampleError TupleMaker functional_datapipe "
        "pick_field reraise_exception skips"
    ),
    "grouping": (
        "Handler IterDataPipe Pipe SampleError ShardUrl WebDatasetGrouper functional_datapipe "
        "group_members logger reraise_exception split_key"
    ),
    "handlers": "EXACT_EPOCH_FLAG Handler ignore_and_continue logger reraise_exception skips warn_and_continue",
    "http_stream": "HttpStream Limits STREAM_FAILURES ShardOpenError ShardReadError get_limits logger",
    "limits": "Limits MiB get_limits set_limits",
    "member_places": (
        "BUFFER_BYTES FORMAT IndexMismatchError Limits MemberPlaces ROW ROW_1 ShardFormatError "
        "ShardOpenError ShardPlaces ShardUrl SpanPlaces WdsError bad_members bad_place file_stamp "
        "local_path logger open_placed places_of_members places_of_samples read_new read_placed "
        "shard_error split_key truncated url_scheme usable_stamp"
    ),
    "openers": (
        "HttpStream Limits LocalPath Opener ShardOpenError ShardUrl WdsError get_limits local_path "
        "open_shard register_opener shard_error stream_size url_scheme"
    ),
    "pipe_base": "IterDataPipe Pipe T_co",
    "placed_shuffle": (
        "EXACT_EPOCH_FLAG Limits OPEN_PER_LANE ReaderPlan ShardFormatError ShardIndex ShardUrl SpanList "
        "bad_members bad_place local_path member_places open_placed places_of_samples read_new "
        "shard_error shuffled_by_places usable_stamp"
    ),
    "shard_index": (
        "IndexMismatchError LocalPath MemberPlaces NO_OFFSET OFFSET_DTYPE OFFSET_UNIT ShardIndex "
        "ShardInfo ShardPlaces ShardScan WIDS_VERSION WdsError build_index check_scan_against file_stamp "
        "iter_tar_places open_shard places_of_members scan_shard split_key stream_size url_scheme"
    ),
    "shard_listing": (
        "EpochSeed IterDataPipe LocalPath NoShardsError Pipe SHARDING_PRIORITIES SHARD_SUFFIXES "
        "ShardListBase ShardLister ShardingFilterIterDataPipe ShardingRecord expand_url_spec "
        "functional_datapipe loader_worker local_path resolve_local url_scheme"
    ),
    "shuffling": "EpochSeed IterDataPipe Pipe Shuffler T functional_datapipe worker_and_rank",
    "tar_loader": (
        "Handler IterDataPipe Limits Pipe ShardUrl TarLoader WdsError functional_datapipe get_limits "
        "iter_tar_members open_shard reraise_exception"
    ),
    "tar_reader": (
        "BLOCK CHUNK Limits ReadInto ShardFormatError ShardOpenError ShardReadError WdsError get_limits "
        "iter_tar_index iter_tar_members iter_tar_places logger shard_error"
    ),
    "threads": "InlineExecutor R T check_positive ordered_map worker_threads",
    "topology": (
        "EpochClock EpochSeed SHARDING_PRIORITIES ShardingRecord Topology distributed_rank_world "
        "epoch_rng loader_worker worker_and_rank"
    ),
    "torch_datapipes": "logger",
    "vision": "CenterCrop Crop RandomResizedCrop apply_crop check_image_pixels decode_transform_into",
}


@pytest.fixture(autouse=True)
def _old_paths_imported_only_here():
    """Old paths this test imports are forgotten after it: other tests import them afresh (and see the warning)."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if isinstance(sys.modules[name], _moved._MovedModule):
            del sys.modules[name]


@pytest.mark.parametrize("old", sorted(OLD_NAMES))
def test_every_name_of_the_flat_layout_resolves_at_its_old_path(old):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        module = importlib.import_module(f"wds_datapipes.{old}")
        missing = [name for name in OLD_NAMES[old].split() if not hasattr(module, name)]
    assert missing == [], f"wds_datapipes.{old} lost {missing}"


def test_old_decoding_names_are_the_ones_in_use():
    from wds_datapipes import decoding
    from wds_datapipes.decoding import images, specs
    from wds_datapipes.errors import DecodeError

    assert decoding.ImageSpec is images.ImageSpec and decoding.ImageHandler is specs.ImageHandler
    with pytest.warns(DeprecationWarning, match="wds_datapipes.errors.DecodeError"):
        assert decoding.DecodeError is DecodeError
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        decoding.nothing  # noqa: B018


def test_retired_helpers_do_what_the_old_ones_did(tmp_path):
    """Oracle: the old bodies (bbc07ad~1): file_stamp is (st_size, st_mtime_ns) of the open file."""
    import os

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from wds_datapipes.epoch_state import check_settings
        from wds_datapipes.member_places import file_stamp
        from wds_datapipes.placed_shuffle import member_places
    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 10)
    with open(path, "rb") as stream:
        stat = os.stat(path)
        assert file_stamp(stream) == (10, stat.st_mtime_ns)
    assert file_stamp(object()) is None
    assert member_places.__name__ == "wds_datapipes.epochs.places"

    import wds_datapipes as wd

    settings, other = wd.PlanSettings(seed=1, batch_size=4), wd.PlanSettings(seed=2, batch_size=4)
    state = wd.EpochState(epoch=0, batches=0, settings=settings)
    check_settings(state, settings)
    with pytest.raises(ValueError, match="other plan settings"):
        check_settings(state, other)


def test_usable_stamp_is_none_where_a_shard_has_no_places_or_is_not_local():
    """Oracle: the old body (bbc07ad~1): None without places or for a non-file URL."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from wds_datapipes.member_places import usable_stamp

    class Places:
        def stamp(self, shard):
            return None if shard == 0 else (10, 1)

    assert usable_stamp(Places(), 0, "/data/a.tar", 10) is None
    assert usable_stamp(Places(), 1, "http://host/a.tar", 10) is None


# Oracle: the public names of the shard cache's modules when they sat in shards/ (4e370db, the
# commit before the cache got its own room), listed as OLD_NAMES was: an ast walk of each top level.
OLD_CACHE_NAMES = {
    "shards.cache": (
        "CacheDirectoryError CacheSettings CacheStats DIR_ENV DISABLED LIMIT_ENV LOCAL_ENV Limits REVALIDATE_ENV "
        "STATS Store cache_stats cached_copy fault get_cache get_limits keeps log_cache_stats logger "
        "make_directory openers parse_size register_counters set_cache verify verify_cache"
    ),
    "shards.cache_settings": "CacheSettings parse_size",
    "shards.cache_store": (
        "BOOT CacheSettings DISABLED Download LEDGER_ROOM Limits LocalCopy ReadAlong STATS Store add create_new "
        "fault key_of logger make_directory object_identity open_existing openers own_download probe_alive "
        "publish release_lock tar_problem try_lock unlink verify"
    ),
    "shards.cache_streams": (
        "BLOCK CHUNK CacheStats DOWNLOADS Download Limits LocalCopy ReadAlong STATS ShardReadError WdsError add "
        "compression iter_tar_members logger openers own_download probe_alive tar_problem"
    ),
}


def _forget(module: str) -> None:
    """As if ``module`` was never imported: an import then finds it afresh (and warns)."""
    sys.modules.pop(module, None)
    package, _, name = module.rpartition(".")
    if package in sys.modules:
        vars(sys.modules[package]).pop(name, None)  # an import sets it on its package too


@pytest.mark.parametrize("old", sorted(OLD_CACHE_NAMES))
def test_every_name_of_the_shard_cache_s_old_modules_resolves_there_with_a_warning(old):
    _forget(f"wds_datapipes.{old}")
    with pytest.warns(DeprecationWarning, match=f"wds_datapipes.{old} moved: its names are in wds_datapipes.cache."):
        module = importlib.import_module(f"wds_datapipes.{old}")
    missing = [name for name in OLD_CACHE_NAMES[old].split() if not hasattr(module, name)]
    assert missing == [], f"wds_datapipes.{old} lost {missing}"


def test_the_shard_cache_s_old_paths_are_the_same_objects_and_old_pickles_load():
    """Oracle for the pickles: protocol 0 names a class by its module path in plain text, so today's
    pickle with the old path put in its place is the bytes a pickle made before the move held."""
    import pickle

    import wds_datapipes as wd
    from wds_datapipes.cache import layer, store

    _forget("wds_datapipes.shards.cache")
    _forget("wds_datapipes.shards.cache_store")
    with pytest.warns(DeprecationWarning, match="wds_datapipes.shards.cache moved"):
        from wds_datapipes.shards import cache as old_cache
    assert old_cache.set_cache is layer.set_cache is wd.set_cache
    with pytest.warns(DeprecationWarning, match="wds_datapipes.shards.cache_store moved"):
        from wds_datapipes.shards.cache_store import key_of
    assert key_of is store.key_of

    settings = wd.CacheSettings("/tmp/shards", 1 << 30)
    stats = wd.CacheStats(hits=3, misses=1)
    for value, new, old in ((settings, b"wds_datapipes.cache.settings", b"wds_datapipes.shards.cache_settings"),
                            (stats, b"wds_datapipes.cache.streams", b"wds_datapipes.shards.cache_streams")):
        made = pickle.dumps([wd.ShardLister(["a.tar"]).load_tar(), value], protocol=0)
        assert made.count(new) == 1
        before = made.replace(new, old)
        assert new not in before
        _forget(old.decode())
        with pytest.warns(DeprecationWarning, match=old.decode()):
            pipe, loaded = pickle.loads(before)
        assert type(loaded) is type(value) and loaded == value
        assert type(pipe) is wd.TarLoader and list(pipe.source_datapipe) == ["a.tar"]
