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
