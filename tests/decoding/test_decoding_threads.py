"""Decoding of sample fields: errors and handlers, threads, and the pipe's mechanics (values: test_decoding.py)."""

from __future__ import annotations

import pickle
import threading

import pytest
from torch.utils.data.datapipes.iter import IterableWrapper

from tests.decoding.decoding_data import (
    IMAGES,
    URL,
    assert_same,
    make_jpeg,
    make_sample,
    upper_text,
)
from wds_datapipes.decoding.decoder import Decoder
from wds_datapipes.errors import DecodeError
from wds_datapipes.handlers import warn_and_continue

# ---------------------------------------------------------------- errors


def _with_corrupt_jpeg() -> list[dict]:
    return [
        make_sample("good-1", jpg=IMAGES["jpg"], cls=b"1"),
        make_sample("bad", jpg=b"\xff\xd8\xff\xe0 not a jpeg", cls=b"2"),
        make_sample("good-2", jpg=IMAGES["jpg"], cls=b"3"),
    ]


def test_default_handler_raises_decode_error_naming_url_key_and_field():
    with pytest.raises(DecodeError) as caught:
        list(Decoder(IterableWrapper(_with_corrupt_jpeg()), "rgb8"))

    error = caught.value
    assert (error.url, error.key, error.field) == (URL, "bad", "jpg")
    assert URL in str(error) and "'bad'" in str(error) and "'jpg'" in str(error)
    assert isinstance(error.__cause__, OSError)  # Pillow's own error, chained


@pytest.mark.parametrize("num_threads", [0, 2])
def test_warn_and_continue_skips_the_whole_corrupt_sample_with_a_warning(num_threads):
    pipe = Decoder(
        IterableWrapper(_with_corrupt_jpeg()), "rgb8", handler=warn_and_continue, num_threads=num_threads
    )

    with pytest.warns(UserWarning) as caught:
        decoded = list(pipe)

    assert [sample["__key__"] for sample in decoded] == ["good-1", "good-2"]
    (warning,) = [str(w.message) for w in caught]
    assert URL in warning and "'bad'" in warning and "'jpg'" in warning


def _stop_quietly(exn: BaseException) -> bool:
    return False


def test_a_handler_that_does_not_say_skip_lets_the_error_through():
    with pytest.raises(DecodeError):
        list(Decoder(IterableWrapper(_with_corrupt_jpeg()), "rgb8", handler=_stop_quietly))


# ---------------------------------------------------------------- threads


def _many_samples(count: int = 200) -> list[dict]:
    samples = []
    for index in range(count):
        jpg = make_jpeg(20 + index % 50, 10 + index % 37, seed=index)
        if index % 41 == 5:
            jpg = b"broken"
        samples.append(make_sample(f"s{index:04d}", jpg=jpg, cls=str(index).encode(), json=b'{"i": %d}' % index))
    return samples


def _skip_quietly(exn: BaseException) -> bool:
    return True


def test_threads_give_the_same_samples_in_the_same_order():
    samples = IterableWrapper(_many_samples())

    inline = list(Decoder(samples, "torchrgb8", handler=_skip_quietly))
    threaded = list(Decoder(samples, "torchrgb8", handler=_skip_quietly, num_threads=2))

    assert len(inline) == 200 - 5
    assert [s["__key__"] for s in threaded] == [s["__key__"] for s in inline]
    for ours, reference in zip(threaded, inline, strict=True):
        assert_same(ours, reference)


def _decode_threads() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name.startswith("wds-decode")]


def test_closing_a_threaded_iterator_early_shuts_its_pool_down():
    iterator = iter(Decoder(IterableWrapper(_many_samples(50)), "rgb8", num_threads=3))
    next(iterator)
    assert _decode_threads()

    iterator.close()

    assert not _decode_threads()


def test_threaded_errors_surface_in_input_order():
    pipe = Decoder(IterableWrapper(_many_samples(60)), "rgb8", num_threads=4)
    keys = []

    with pytest.raises(DecodeError) as caught:
        for sample in pipe:
            keys.append(sample["__key__"])

    assert caught.value.key == "s0005" and keys == ["s0000", "s0001", "s0002", "s0003", "s0004"]


# ---------------------------------------------------------------- pipe mechanics


def test_decode_is_the_functional_name():
    pipe = IterableWrapper([make_sample(cls=b"1")]).decode("rgb8", only="cls")

    assert isinstance(pipe, Decoder) and list(pipe) == [{**make_sample(), "cls": 1}]


def test_pipe_pickles_before_and_after_iterating_with_threads():
    samples = IterableWrapper(_many_samples(20))
    pipe = Decoder(samples, "rgb8", {"*.json": upper_text}, handler=_skip_quietly, num_threads=2)
    expected = [sample["__key__"] for sample in pipe]

    clone = pickle.loads(pickle.dumps(pipe))

    assert [sample["__key__"] for sample in clone] == expected
    assert clone.num_threads == 2


def test_pipe_has_no_length():
    with pytest.raises(TypeError):
        len(Decoder(IterableWrapper([make_sample()])))


def test_negative_thread_count_is_refused():
    with pytest.raises(ValueError, match="num_threads"):
        Decoder(IterableWrapper([]), num_threads=-1)
