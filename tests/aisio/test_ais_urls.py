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


@pytest.mark.parametrize("bad, why", [("s3://bkt/x", "not an ais:// URL"), ("ais://", "no bucket"),
                                      ("ais:///x", "no bucket"), ("ais://b/x?etl_args=1", "without etl_name"),
                                      ("ais://b/x?etl_local=m:C", "without etl_name")])
def test_urls_without_a_bucket_or_with_etl_args_but_no_etl_are_refused(bad, why):
    with pytest.raises(ValueError, match=why):
        AISUrl.parse(bad)


def test_url_carries_the_local_etl_class_and_round_trips():
    url = AISUrl.parse("ais://bkt/x.tar").with_etl("resize", {"size": 8}, local="pkg.mod:Resize")
    again = AISUrl.parse(str(url))
    assert again == url and again.etl_local == "pkg.mod:Resize"
    assert again.etl is None  # the cluster is not asked to run it


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
    pattern = _template_regex("shuffled-shard-%06d.tar")
    assert pattern.match("shuffled-shard-000012.tar") and not pattern.match("shuffled-shard-x.tar")


def test_dsort_spec_passes_aistores_fmt_output_template_through():
    spec = dsort_spec("ais://in/train-{000..009}.tar", "ais://out/shuffled-shard-%d.tar")
    assert spec["output_format"] == "shuffled-shard-%d.tar"
    assert spec["output_extension"] == ".tar" and spec["input_format"] == {"template": "train-{000..009..1}.tar"}


def test_lister_pipeline_pickles_and_does_no_io_when_built(monkeypatch):
    import pickle

    from aisio import AISSourceLister, nodes, rest

    def no_io(*args, **kwargs):
        raise AssertionError("building or pickling the pipe sent a request")

    monkeypatch.setattr(rest, "request", no_io)
    monkeypatch.setattr(nodes, "view_of", no_io)
    lister = AISSourceLister("ais://bkt/train-{000..009}.tar", etl_name="e", etl_args={"a": 1}, shuffle=True)
    clone = pickle.loads(pickle.dumps(lister.load_tar().group_by_key()))
    assert type(clone) is type(lister.load_tar().group_by_key())
    assert pickle.loads(pickle.dumps(lister)).specs == ["ais://bkt/train-{000..009}.tar"]


def test_lister_refuses_non_ais_specs_and_mixed_arguments():
    from aisio import AISSourceLister

    with pytest.raises(ValueError, match="not an ais:// URL"):
        AISSourceLister("s3://bkt/x")
    with pytest.raises(ValueError, match="give either urls"):
        AISSourceLister("ais://bkt/", bucket="bkt")
    with pytest.raises(ValueError, match="etl_args given without etl_name"):
        AISSourceLister("ais://bkt/", etl_args="x")
    with pytest.raises(ValueError, match="ais_sources .* not both"):
        AISSourceLister("ais://bkt/", ais_sources=["bkt"])
