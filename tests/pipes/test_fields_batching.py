"""Per-field pipes (to_tuple, rename_keys, map_fields), batching with collation, and the sample shuffle."""

from __future__ import annotations

import pickle
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data.datapipes.iter import IterableWrapper

from wds_datapipes import (
    Batcher,
    FieldMapper,
    KeyRenamer,
    SampleError,
    ShardLister,
    Shuffler,
    TupleMaker,
    collate,
    warn_and_continue,
)

URL = "file:///data/shard-000003.tar"


def _sample(key: str, **fields) -> dict:
    return {"__key__": key, "__url__": URL, **fields}


def _double(value: int) -> int:
    return 2 * value


# ---------------------------------------------------------------- to_tuple


def test_to_tuple_picks_the_first_present_alternative():
    samples = [
        _sample("a", jpg=b"j", cls=b"1"),
        _sample("b", png=b"p", cls=b"2"),
        _sample("c", png=b"p2", jpg=b"j2", cls=b"3"),
    ]
    assert list(IterableWrapper(samples).to_tuple("jpg;png", "cls")) == [
        (b"j", b"1"), (b"p", b"2"), (b"j2", b"3"),
    ]


def test_to_tuple_takes_space_separated_names_in_one_string_as_webdataset_does():
    samples = [_sample("a", jpg=b"j", cls=b"1"), _sample("b", png=b"p", cls=b"2")]
    assert list(IterableWrapper(samples).to_tuple("png;jpg cls")) == [(b"j", b"1"), (b"p", b"2")]
    assert list(IterableWrapper(samples).to_tuple("png;jpg cls")) == list(
        IterableWrapper(samples).to_tuple("png;jpg", "cls"))
    assert list(IterableWrapper(samples).to_tuple(" cls ")) == [(b"1",), (b"2",)]


def test_to_tuple_treats_a_field_holding_none_as_missing_as_webdataset_does():
    samples = [_sample("a", jpg=None, cls=b"1")]
    with pytest.raises(SampleError, match="None"):
        list(IterableWrapper(samples).to_tuple("jpg", "cls"))


def test_to_tuple_missing_field_raises_sample_error_naming_sample_and_fields():
    samples = [_sample("ok", jpg=b"j", cls=b"1"), _sample("k7", txt=b"t", cls=b"2")]
    with pytest.raises(SampleError) as caught:
        list(IterableWrapper(samples).to_tuple("jpg;png", "cls"))
    message = str(caught.value)
    assert (caught.value.url, caught.value.key) == (URL, "k7")
    for part in (URL, "k7", "jpg;png"):
        assert part in message


def test_to_tuple_missing_field_with_warn_and_continue_skips_that_sample():
    samples = [_sample("a", jpg=b"1", cls=b"1"), _sample("b", cls=b"2"), _sample("c", jpg=b"3", cls=b"3")]
    with pytest.warns(UserWarning, match="skipped: .*'b'"):
        out = list(IterableWrapper(samples).to_tuple("jpg", "cls", handler=warn_and_continue))
    assert out == [(b"1", b"1"), (b"3", b"3")]


def test_to_tuple_needs_a_field():
    with pytest.raises(ValueError):
        TupleMaker(IterableWrapper([]))


# ---------------------------------------------------------------- rename_keys, map_fields


def test_rename_keys_renames_and_keeps_the_other_fields():
    samples = [_sample("a", jpg=b"j", cls=b"1", txt=b"t"), _sample("b", png=b"p", cls=b"2")]
    out = list(IterableWrapper(samples).rename_keys(image="jpg;png", label="cls"))
    assert out == [
        {"__key__": "a", "__url__": URL, "txt": b"t", "image": b"j", "label": b"1"},
        {"__key__": "b", "__url__": URL, "image": b"p", "label": b"2"},
    ]


def test_rename_keys_without_keep_drops_the_other_fields():
    samples = [_sample("a", jpg=b"j", cls=b"1", txt=b"t")]
    assert list(IterableWrapper(samples).rename_keys(keep=False, image="jpg")) == [
        {"__key__": "a", "__url__": URL, "image": b"j"},
    ]


def test_rename_keys_missing_field_goes_to_the_handler():
    samples = [_sample("a", txt=b"t"), _sample("b", jpg=b"j")]
    with pytest.raises(SampleError, match="'a'"):
        list(IterableWrapper(samples).rename_keys(image="jpg"))
    with pytest.warns(UserWarning, match="skipped"):
        out = list(IterableWrapper(samples).rename_keys(image="jpg", handler=warn_and_continue))
    assert [s["__key__"] for s in out] == ["b"]


def test_map_fields_applies_functions_to_named_fields_only():
    samples = [_sample("a", label=1, n=5, txt="t")]
    out = list(IterableWrapper(samples).map_fields(label=_double, n=str))
    assert out == [_sample("a", label=2, n="5", txt="t")]
    assert samples == [_sample("a", label=1, n=5, txt="t")]  # the source sample is not changed
    assert list(FieldMapper(IterableWrapper([_sample("b", cls=b"3")]), cls=int)) == [_sample("b", cls=3)]


def test_map_fields_functional_form_maps_the_cls_field_given_as_a_dict():
    # torch's functional wrapper takes `cls` itself, so that field comes in a dict.
    samples = [_sample("a", cls=b"1", txt=b"t")]
    assert list(IterableWrapper(samples).map_fields({"cls": int})) == [_sample("a", cls=1, txt=b"t")]
    assert list(IterableWrapper(samples).rename_keys({"cls": "txt", "label": "cls"}, keep=False)) == [
        {"__key__": "a", "__url__": samples[0]["__url__"], "cls": b"t", "label": b"1"}
    ]


def test_map_fields_failure_is_a_sample_error_given_to_the_handler():
    samples = [_sample("a", label=b"1"), _sample("bad", label=b"x"), _sample("c", label=b"3")]
    with pytest.raises(SampleError, match=r"'bad'.*ValueError") as caught:
        list(IterableWrapper(samples).map_fields(label=int))
    # The default handler re-raises inside the except block: the ValueError is the context.
    assert isinstance(caught.value.__cause__ or caught.value.__context__, ValueError)
    with pytest.warns(UserWarning, match="skipped"):
        out = list(IterableWrapper(samples).map_fields(label=int, handler=warn_and_continue))
    assert [s["label"] for s in out] == [1, 3]
    with pytest.raises(SampleError, match="missing"):
        list(IterableWrapper([_sample("m", txt=b"")]).map_fields(missing=int))


# ---------------------------------------------------------------- collate / batch_samples


def test_collate_stacks_same_shape_tensors():
    items = [torch.randn(3, 2) for _ in range(4)]
    out = collate(items)
    assert torch.equal(out, torch.stack(items))


def _layouts() -> dict[str, list[torch.Tensor]]:
    hwc = [torch.from_numpy(np.random.default_rng(i).integers(0, 255, (5, 4, 3), dtype=np.uint8)) for i in range(3)]
    base = [torch.arange(24, dtype=torch.float32).reshape(4, 6) * (i + 1) for i in range(3)]
    return {
        "contiguous": base,
        "chw-view-of-hwc": [x.permute(2, 0, 1) for x in hwc],
        "sliced": [x[:, ::2] for x in base],
        "transposed": [x.t() for x in base],
        "expanded": [torch.arange(3.0).expand(2, 3) + 0 * i for i in range(3)],
        "stride-0": [torch.tensor([float(i)]).expand(4) for i in range(3)],
        "zero-dim": [torch.tensor(float(i)) for i in range(3)],
        "empty": [torch.zeros(0, 3) for _ in range(3)],
        "bool": [torch.arange(6).reshape(2, 3) % (i + 2) == 0 for i in range(3)],
        "float16": [x.half() for x in base],
        "bfloat16": [x.bfloat16() for x in base],
        "int64": [x.long() for x in base],
        "complex": [torch.complex(x, -x) for x in base],
        "requires-grad": [x.clone().requires_grad_() for x in base],
        "mixed-strides": [base[0], base[1].t().contiguous().t(), base[2]],
    }


@pytest.mark.parametrize("layout", list(_layouts()))
def test_collate_stacks_tensors_of_any_layout_as_torch_stack_does(layout):
    items = _layouts()[layout]
    out = collate(items)
    expected = torch.stack(items)
    assert out.shape == expected.shape
    assert out.dtype == expected.dtype
    assert torch.equal(out.detach(), expected.detach())
    before = [x.detach().clone() for x in items]
    out.detach().add_(1) if out.dtype != torch.bool else out.detach().logical_not_()
    assert all(torch.equal(x.detach(), b) for x, b in zip(items, before))  # a copy, not a view of an item


def _crops(widths: list[int]) -> list[torch.Tensor]:
    """Centre crops (CHW views) of HWC images of different widths, as a crop transform makes them."""
    images = [torch.from_numpy(np.random.default_rng(w).integers(0, 255, (6, w, 3), dtype=np.uint8)) for w in widths]
    return [x.permute(2, 0, 1)[:, 1:5, (w - 4) // 2 : (w - 4) // 2 + 4] for x, w in zip(images, widths)]


def test_crops_of_images_of_different_widths_stack_in_their_layout_through_numpy():
    """Oracle: torch.stack. Views of different strides but one dimension order are copied by
    numpy into one NHWC buffer (the fast path), not handed to torch.stack (contiguous NCHW)."""
    items = _crops([7, 9, 12, 30])
    assert len({x.stride() for x in items}) == 4
    out = collate(items)
    assert torch.equal(out, torch.stack(items))
    assert out.is_contiguous(memory_format=torch.channels_last)


def _collate_in_a_child(queue, copies: int) -> None:
    batch = collate(_crops([7, 9, 12]) * copies)
    queue.put((batch.is_shared(), np.ascontiguousarray(batch.numpy())))  # by value: the child may exit


@pytest.mark.parametrize("copies, shared", [(700, True), (1, False)])
def test_a_batch_collated_in_a_child_process_is_made_in_shared_memory_unless_small(copies, shared):
    """A loader's worker sends a batch in shared memory as it is; else torch copies it into new
    shared memory at the send (torch's default_collate allocates it there the same way). A batch
    of up to INLINE_MAX_BYTES (here 3 crops, 144 bytes; 2,100 are 100 KB) is private memory, sent
    by value (pipes/shared_batches.py). Oracle: torch.stack."""
    import multiprocessing

    assert not collate(_crops([7, 9, 12])).is_shared()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_collate_in_a_child, args=(queue, copies))
    child.start()
    try:
        is_shared, batch = queue.get(timeout=60)
    finally:
        child.join(timeout=60)
    assert is_shared == shared
    assert torch.equal(torch.from_numpy(batch), torch.stack(_crops([7, 9, 12]) * copies))


def test_batch_samples_under_a_dataloader_gives_the_batches_of_one_process():
    samples = [{"x": torch.full((2, 3), float(i)), "n": i} for i in range(10)]
    loader = torch.utils.data.DataLoader(IterableWrapper(samples).batch_samples(4), batch_size=None, num_workers=1,
                                         timeout=60)
    expected = list(IterableWrapper(samples).batch_samples(4))
    got = list(loader)
    assert len(got) == len(expected) == 3
    assert all(torch.equal(a["x"], b["x"]) and torch.equal(a["n"], b["n"]) for a, b in zip(got, expected))


def test_collate_stacks_conjugate_views_as_torch_stack_does():
    items = [torch.complex(torch.ones(2, 3), torch.full((2, 3), float(i))).conj() for i in range(3)]
    assert torch.equal(collate(items), torch.stack(items))


def test_collate_stacks_ndarrays_into_a_tensor_of_their_dtype():
    for dtype in (np.uint8, np.float32, np.int64):
        items = [np.arange(6, dtype=dtype).reshape(2, 3) + i for i in range(3)]
        out = collate(items)
        assert isinstance(out, torch.Tensor)
        assert torch.equal(out, torch.from_numpy(np.stack(items)))


def test_collate_turns_python_numbers_into_a_tensor():
    assert torch.equal(collate([1, 2, 3]), torch.tensor([1, 2, 3]))
    assert collate([1, 2, 3]).dtype == torch.int64
    assert torch.equal(collate([True, False]), torch.tensor([True, False]))
    floats = collate([0.5, 1, 2.25])
    assert floats.dtype.is_floating_point
    assert floats.tolist() == [0.5, 1.0, 2.25]


def test_collate_turns_numpy_integer_scalars_into_a_tensor():
    out = collate([np.int64(1), np.int64(2)])
    assert isinstance(out, torch.Tensor)
    assert out.tolist() == [1, 2]


def test_collate_leaves_strings_bytes_and_ragged_items_as_lists():
    assert collate(["a", "bc"]) == ["a", "bc"]
    assert collate([b"a", b"bc"]) == [b"a", b"bc"]
    ragged = [torch.zeros(2), torch.zeros(3)]
    assert collate(ragged) == ragged
    mixed_dtype = [torch.zeros(2), torch.zeros(2, dtype=torch.int64)]
    assert collate(mixed_dtype) == mixed_dtype
    ragged_arrays = [np.zeros(2), np.zeros(3)]
    assert collate(ragged_arrays) == ragged_arrays
    assert collate([1, "x"]) == [1, "x"]


def test_collate_dicts_and_tuples_field_by_field():
    samples = [{"x": torch.full((2,), i), "n": i, "s": f"s{i}", "meta": {"k": i}} for i in range(3)]
    out = collate(samples)
    assert torch.equal(out["x"], torch.stack([s["x"] for s in samples]))
    assert torch.equal(out["n"], torch.tensor([0, 1, 2]))
    assert out["s"] == ["s0", "s1", "s2"]
    assert torch.equal(out["meta"]["k"], torch.tensor([0, 1, 2]))
    tuples = [(np.ones(2) * i, i, b"b") for i in range(3)]
    image, label, raw = collate(tuples)
    assert torch.equal(image, torch.from_numpy(np.stack([t[0] for t in tuples])))
    assert torch.equal(label, torch.tensor([0, 1, 2]))
    assert raw == [b"b"] * 3


def test_batch_samples_yields_full_batches_then_the_partial_one():
    samples = [(torch.tensor([i]), i) for i in range(10)]
    batches = list(IterableWrapper(samples).batch_samples(4))
    assert [len(labels) for _, labels in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([labels for _, labels in batches]), torch.arange(10))
    assert torch.equal(batches[0][0], torch.stack([s[0] for s in samples[:4]]))


def test_batch_samples_without_partial_drops_the_last_short_batch():
    batches = list(IterableWrapper(list(range(10))).batch_samples(4, partial=False))
    assert [b.tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert len(list(IterableWrapper(list(range(8))).batch_samples(4, partial=False))) == 2


def test_batch_samples_uses_a_given_collate_fn():
    assert list(IterableWrapper(list(range(5))).batch_samples(2, collate_fn=sum)) == [1, 5, 4]


def test_batch_samples_rejects_a_batch_size_below_one():
    with pytest.raises(ValueError):
        Batcher(IterableWrapper([]), 0)


# ---------------------------------------------------------------- shuffle_samples


@pytest.mark.parametrize(("bufsize", "initial"), [(1, 100), (5, 1), (20, 10), (1000, 100)])
def test_shuffle_samples_yields_a_permutation(bufsize, initial):
    items = [i % 17 for i in range(200)]  # repeated values: compare multisets
    out = list(IterableWrapper(items).shuffle_samples(bufsize=bufsize, initial=initial, seed=1))
    assert Counter(out) == Counter(items)
    if bufsize > 1:
        assert out != items


def test_shuffle_samples_with_bufsize_one_keeps_the_order():
    items = list(range(50))
    assert list(IterableWrapper(items).shuffle_samples(bufsize=1)) == items


def test_shuffle_samples_with_a_seed_repeats_and_changes_per_epoch():
    items = list(range(100))
    first, second = (IterableWrapper(items).shuffle_samples(bufsize=30, seed=4) for _ in range(2))
    epochs = [list(first) for _ in range(3)]
    assert epochs == [list(second) for _ in range(3)]
    assert len({tuple(e) for e in epochs}) == 3
    assert list(IterableWrapper(items).shuffle_samples(bufsize=30, seed=5)) != epochs[0]


def test_shuffle_samples_follows_the_loader_seed():
    items = list(range(100))

    def order(loader_seed: int) -> list[int]:
        return list(IterableWrapper(items).shuffle_samples(bufsize=30, seed=4).set_seed(loader_seed))

    assert order(1) == order(1)
    assert order(1) != order(2)


def test_shuffle_samples_rejects_an_empty_buffer():
    with pytest.raises(ValueError):
        Shuffler(IterableWrapper([]), bufsize=0)


# ---------------------------------------------------------------- pickling


def test_every_pipe_pickles_and_iterates_the_same(make_shards):
    shards = make_shards(2, 6)
    dp = (
        ShardLister(shards, shuffle=True, seed=2)
        .load_tar()
        .group_by_key()
        .rename_keys(label="cls")
        .map_fields(label=int)
        .shuffle_samples(bufsize=5, seed=3)
        .to_tuple("__key__", "label", "txt;text")
        .batch_samples(4)
    )
    for pipe in (dp, dp.source_datapipe, dp.source_datapipe.source_datapipe):
        assert type(pickle.loads(pickle.dumps(pipe))) is type(pipe)
    clone = pickle.loads(pickle.dumps(dp))
    for _ in range(2):  # the same seeds and epoch counters travel with the pipe
        mine, theirs = list(dp), list(clone)
        assert [b[0] for b in mine] == [b[0] for b in theirs]
        assert sorted(k for b in mine for k in b[0]) == sorted(
            f"s-{s:03d}-{i:03d}" for s in range(2) for i in range(6)
        )
        assert all(torch.equal(a[1], b[1]) for a, b in zip(mine, theirs))


@pytest.mark.parametrize(
    "make",
    [
        lambda src: TupleMaker(src, "a;b", handler=warn_and_continue),
        lambda src: KeyRenamer(src, keep=False, x="a"),
        lambda src: FieldMapper(src, a=_double),
        lambda src: Batcher(src, 3, partial=False),
        lambda src: Shuffler(src, bufsize=4, seed=1),
    ],
    ids=["to_tuple", "rename_keys", "map_fields", "batch_samples", "shuffle_samples"],
)
def test_field_and_batch_pipes_pickle(make):
    dp = make(IterableWrapper([_sample(str(i), a=i) for i in range(7)]))
    clone = pickle.loads(pickle.dumps(dp))
    assert repr(list(clone)) == repr(list(dp))
