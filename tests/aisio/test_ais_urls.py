"""ais:// URL parsing and the dSort request, which need no cluster."""

from __future__ import annotations

import pytest

from aisio.client import AISUrl
from aisio.dsort import _template_regex, dsort_spec


def test_url_splits_bucket_and_object_keeping_slashes():
    url = AISUrl.parse("ais://bkt/a/b/train-000.tar")
    assert (url.bucket, url.object, url.etl_name) == ("bkt", "a/b/train-000.tar", None)
    assert str(url) == "ais://bkt/a/b/train-000.tar"


def test_url_carries_etl_name_and_args_and_round_trips():
    url = AISUrl.parse("ais://bkt/x.tar").with_etl("resize", {"size": 224, "mode": "crop"})
    assert url.etl_name == "resize" and url.etl_args == '{"mode":"crop","size":224}'
    again = AISUrl.parse(str(url))
    assert again == url and again.plain == "ais://bkt/x.tar"
    assert again.etl.name == "resize"


def test_question_mark_that_is_not_an_etl_query_stays_in_the_object_name():
    url = AISUrl.parse("ais://bkt/what?.tar")
    assert url.object == "what?.tar" and url.etl_name is None


@pytest.mark.parametrize("bad", ["s3://bkt/x", "ais://", "ais:///x", "ais://b/x?etl_args=1"])
def test_bad_urls_are_refused(bad):
    with pytest.raises(ValueError):
        AISUrl.parse(bad)


def test_dsort_spec_names_templates_size_seed_and_dsorter():
    spec = dsort_spec("ais://in/train-{000..009}.tar", "ais://out/shuf-{0000..0099}.tar",
                      output_shard_size="10MiB", seed=3)
    assert spec["input_bck"] == {"name": "in", "provider": "ais"}
    assert spec["input_format"] == {"template": "train-{000..009..1}.tar"}
    assert spec["output_format"] == "shuf-{0000..0099..1}.tar"
    assert spec["output_shard_size"] == "10MiB"
    assert spec["algorithm"]["kind"] == "shuffle" and spec["algorithm"]["seed"] == "3"
    assert spec["dsorter_type"] == "dsort_general"


def test_output_template_regex_matches_only_template_names():
    pattern = _template_regex("shuf-{0000..9999..1}.tar")
    assert pattern.match("shuf-0042.tar")
    assert not pattern.match("shuf-0042.tar.bak") and not pattern.match("other-0042.tar")


def test_lister_pipeline_pickles_and_does_no_io_when_built():
    import pickle

    from aisio import AISSourceLister

    # No cluster at this address: building the pipe must not touch it.
    dp = AISSourceLister("ais://bkt/train-{000..009}.tar", etl_name="e", etl_args={"a": 1}, shuffle=True)
    dp = dp.load_tar().group_by_key()
    clone = pickle.loads(pickle.dumps(dp))
    assert type(clone) is type(dp)


def test_lister_refuses_non_ais_specs_and_mixed_arguments():
    from aisio import AISSourceLister

    with pytest.raises(ValueError):
        AISSourceLister("s3://bkt/x")
    with pytest.raises(ValueError):
        AISSourceLister("ais://bkt/", bucket="bkt")
    with pytest.raises(ValueError):
        AISSourceLister("ais://bkt/", etl_args="x")
