"""webdataset's key rule: which sample a tar member belongs to (:func:`split_key`), and one
shard's members grouped into samples (:func:`group_members`). Pure: no I/O, no torch (the
writer and the command line use them; the ``group_by_key`` pipe is :mod:`.grouping`)."""

from __future__ import annotations

import logging
import re
import warnings
from collections.abc import Iterable, Iterator

from ..errors import SampleError
from ..handlers import Handler, reraise_exception
from .openers import plain_url

# webdataset's key rule, used where the fast split below does not apply.
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")

logger = logging.getLogger("wds_datapipes")


def split_key(name: str) -> tuple[str, str] | None:
    """(key, suffix) of a member name as webdataset makes them, or None for a skipped name.

    The key runs to the first dot of the last path component, the suffix is the rest,
    lowercased: ``a/b.c.d.JPG`` -> (``a/b``, ``c.d.jpg``). Names without such a dot and
    ``__meta__`` names are skipped.
    """
    if name.startswith("__") and (_META_RE.match(name) or ("/" not in name and name.endswith("__"))):
        return None
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot > slash + 1 and "\n" not in name:  # the common case, same result as the regex
        return name[:dot], name[dot + 1 :].lower()
    match = _KEY_RE.match(name)
    return (match.group(1), match.group(2).lower()) if match else None


def group_members(url: str, members: Iterable[tuple[str, bytes | None]], handler: Handler = reraise_exception,
                  report_split_keys: bool = False) -> Iterator[dict]:
    """The samples of one shard's (name, bytes) members: runs of one key, never past the shard.

    When ``url`` is a :class:`ShardUrl` whose reading was cut (``url.cut``), the last
    sample is dropped: the members that would have completed it never came.
    """
    sample: dict = {}
    key: str | None = None  # None until the first member: then no sample is being assembled
    skipping = False  # the current sample hit an error the handler chose to skip
    seen: set[str] = set()
    plain = plain_url(url)  # samples carry a plain str, as webdataset's do; ``url`` keeps the opening
    for name, data in members:
        # split_key's common case, inlined: this loop runs once per tar member.
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if dot > slash + 1 and not name.startswith("__") and "\n" not in name:
            member_key, suffix = name[:dot], name[dot + 1 :].lower()
        else:
            split = split_key(name)
            if split is None:
                continue
            member_key, suffix = split
        if member_key != key:
            if key is not None and not skipping:
                yield sample
            if report_split_keys:
                _check_split(url, member_key, name, seen)
            key, skipping = member_key, False
            sample = {"__key__": key, "__url__": plain}
        elif suffix in sample:
            if not skipping:
                error = SampleError(url, key, f"suffix {suffix!r} repeats within the sample", member=name)
                if not handler(error):
                    raise error
            skipping = True
        sample[suffix] = data
    if key is not None and not skipping:
        if getattr(url, "cut", False):
            logger.warning("shard %r: sample %r dropped: the shard ended in an error before the sample was "
                           "known to be whole", str(url), key)
            return
        yield sample


def _check_split(url: str, key: str, name: str, seen: set[str]) -> None:
    if key in seen:
        warnings.warn(
            f"shard {url!r}: key {key!r} comes back at member {name!r} after other keys; "
            "its files form separate samples",
            stacklevel=2,
        )
    seen.add(key)
