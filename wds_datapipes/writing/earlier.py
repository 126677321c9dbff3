"""What an earlier run left at a destination, and what a run may do about it.

The shards named ``pattern % n`` that are there already (:func:`listed_shards`: the exact
spelling the pattern gives ``n``, of one rank's numbers) are settled before a run writes
anything (:func:`settle_earlier`). A resume keeps them; it checks them as it goes, and at its
end that the input still fills every one (:func:`check_no_more_shards`). A fresh run (no
progress record) refuses them: they would stay beside its own. A restart removes them from a
local folder, with the ``.part`` files a kill left, but only those an earlier run of the
writer left: a file the replaced record names, of the size it recorded, or one whose
modification time is one the writer gives a shard (its ``mtime`` setting plus a fraction of
a second: :func:`~wds_datapipes.writing.shard_file.shard_mtime`). Anything else named like a
shard (a user's file, a link, a folder, a shard changed since) is never removed: the restart
is refused, naming it. At an object store nothing is removed (no back end here deletes
objects): a restart is refused while such objects are listed there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat

from ..errors import ShardWriteError, WdsError
from ..shards.openers import backend_for, list_urls, url_scheme
from ..storage.cloud_settings import PipelineStores, with_stores

logger = logging.getLogger("wds_datapipes")

_FIELD = re.compile(r"%%|%[-+ 0#]*\d*[diu]")  # the one decimal field a listable pattern's file name holds
_DIGITS = re.compile(r" *\+?[0-9]+ *")  # what ``%d`` and its flags (width, ``+``, ``-``, space) make of n >= 0
_PARTS = (".part", ".part.z")  # a shard's temporary names while it is written (shard_file.write_shard)
_SECOND = 1_000_000_000


def listed_shards(pattern: str, rank: int = 0, world: int = 1, stores: PipelineStores | None = None,
                  parts: bool = False) -> dict[int, str] | None:
    """The shards named ``pattern % n`` that are there now (a local folder's entries, a bucket's
    objects as their back end lists them), of rank ``rank``'s numbers (``n % world``): {n: URL}.
    A name counts only where it is exactly ``pattern % n`` (``s-0001.tar`` for ``s-%04d.tar``,
    not ``s-1.tar`` nor ``s-0001.tar.bak``). ``parts``: the local ``.part`` files a kill left
    instead ({0, 1, ...: path}). None where that cannot be listed: the number is not in the
    pattern's last part, the back end lists nothing, or the listing failed (a warning says why)."""
    head, slash, tail = pattern.rpartition("/")
    fields = [m for m in _FIELD.finditer(tail) if m.group() != "%%"]
    if len(fields) != 1 or any(m.group() != "%%" for m in _FIELD.finditer(head)) or "%" in _FIELD.sub("", tail):
        return None
    before, after = tail[: fields[0].start()].replace("%%", "%"), tail[fields[0].end():].replace("%%", "%")
    folder = head.replace("%%", "%") if slash else "."
    if url_scheme(pattern) == "file":
        try:
            names = os.listdir(folder or "/")
        except (FileNotFoundError, NotADirectoryError):
            names = []
    elif parts:
        return {}
    else:
        spec = with_stores(f"{folder}/{before}*{after}", stores)
        if backend_for(spec).list is None or any(c in before + after for c in "*?["):
            return None  # (a glob character in the name would make the listing match other names)
        try:
            names = [str.__str__(url).rpartition("/")[2] for url in list_urls(spec)]
        except (WdsError, OSError) as exn:
            if getattr(exn, "reason", None) == "no object matches":  # an object store's empty listing
                return {}
            logger.warning("%s: cannot list the destination to look for an earlier run's shards (%s)", spec, exn)
            return None
    found: dict[int, str] = {}
    for name in sorted(names):
        shard = name
        if parts:
            shard = next((name[: -len(end)] for end in _PARTS if name.endswith(end)), "")
        n = _number(shard, before, after)
        if n is not None and n % world == rank and tail % n == shard:  # the pattern's own spelling of n
            found[len(found) if parts else n] = pattern % n + name[len(shard):]
    return found


def _number(name: str, before: str, after: str) -> int | None:
    """The number between ``before`` and ``after`` in ``name``, or None."""
    if len(name) <= len(before) + len(after) or not name.startswith(before) or not name.endswith(after):
        return None
    middle = name[len(before): len(name) - len(after)]
    return int(middle) if _DIGITS.fullmatch(middle) else None


def settle_earlier(pattern: str, rank: int, world: int, restart: bool, stores: PipelineStores | None = None, *,
                   earlier_pattern: str | None = None, earlier_mtime: int | None = None,
                   recorded: dict[str, int] | None = None, mtime: int = 0) -> list[str]:
    """Before a run that does not resume: the shards an earlier run left under ``pattern`` (and,
    for a restart, under ``earlier_pattern``, the pattern of the record it replaces), of this
    rank's numbers. ``recorded``: the shards that record names, with their sizes;
    ``earlier_mtime``: its ``mtime`` setting (``mtime``: this run's). A restart removes them
    from a local folder, with any ``.part`` file a kill left, and returns them; it removes
    nothing and raises where any of them is not the writer's (see the module's docstring), or
    where they are objects. A fresh run raises where any are there: they would mix with its own."""
    recorded = {os.path.abspath(url): size for url, size in (recorded or {}).items()}
    patterns = [pattern] + ([earlier_pattern] if restart and earlier_pattern not in (None, pattern) else [])
    local = url_scheme(pattern) == "file"
    urls: dict[str, str] = {}  # each shard found, by its absolute path where local, as first spelled
    for each in patterns:
        listed = listed_shards(each, rank, world, stores)
        if listed is None:
            logger.warning("%s: the shards of an earlier run cannot be listed there; a run leaves any of them it "
                           "does not write over", each)
        for url in (listed or {}).values():
            urls.setdefault(os.path.abspath(url) if local else url, url)
    for path in recorded if local and restart else ():
        if os.path.lexists(path):
            urls.setdefault(path, path)
    found = [urls[key] for key in sorted(urls)]
    if not found:
        return _remove_parts(patterns, rank, world) if restart and local else []
    named = _named(found)
    if local:
        mtimes = {mtime} | ({earlier_mtime} if isinstance(earlier_mtime, int) else set())
        refuse_foreign(found, recorded, mtimes)
    if restart and local:
        for path in found:
            with contextlib.suppress(FileNotFoundError):
                os.remove(path)
        _remove_parts(patterns, rank, world)
        logger.info("restart: removed %d shards of an earlier run (%s)", len(found), named)
        return found
    if restart:
        raise ShardWriteError(f"a restart cannot remove the {len(found)} shards an earlier run left there ({named}): "
                              "no back end here deletes objects. Remove them, then run again with restart=True "
                              "(--restart)", shard=found[0])
    raise ShardWriteError(f"{len(found)} shards named like this run's are there already ({named}) and no progress "
                          "record accounts for them: a run would leave those it does not write over beside its own. "
                          "Remove them, or restart=True (--restart) to replace them", shard=found[0])


def refuse_foreign(paths: list[str], recorded: dict[str, int], mtimes: set[int]) -> None:
    """Raises, naming them, where any of the local ``paths`` named like shards is not one the
    writer left (:func:`_not_the_writers`; ``recorded``: sizes by absolute path)."""
    foreign = [(path, why) for path in paths if (why := _not_the_writers(path, recorded.get(os.path.abspath(path)),
                                                                        mtimes))]
    if not foreign:
        return
    whys = "; ".join(f"{path}: {why}" for path, why in foreign[:3]) + \
        (f"; and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    them = "it" if len(foreign) == 1 else "them"
    what = "a file named like this run's shards is not a shard" if len(foreign) == 1 else \
        f"{len(foreign)} files named like this run's shards are not shards"
    raise ShardWriteError(f"{what} an earlier run of the writer left ({whys}); a restart removes only the writer's "
                          f"own shards, and a run would write over {them} or leave {them} beside its own. Move or "
                          f"remove {them}, or write elsewhere", shard=foreign[0][0])


def _named(found: list[str]) -> str:
    return ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")


def _not_the_writers(path: str, recorded_size: int | None, mtimes: set[int]) -> str | None:
    """Why the local file ``path`` is not a shard the writer left (None where it is one): it is
    not a regular file, or it is neither the record's shard of the size recorded nor a file whose
    modification time the writer gives (one of the ``mtimes`` settings plus under a second)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None  # gone meanwhile: nothing to remove
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file (a link or a folder)"
    if recorded_size is not None and info.st_size == recorded_size:
        return None
    if any(m * _SECOND <= info.st_mtime_ns < (m + 1) * _SECOND for m in mtimes):
        return None
    if recorded_size is not None:
        return f"changed since the earlier run recorded it ({info.st_size} bytes, {recorded_size} recorded)"
    return "its modification time is not one the writer gives its shards"


def _remove_parts(patterns: list[str], rank: int, world: int) -> list[str]:
    """Removes the ``.part`` files (regular files only) of these local patterns' shards of this
    rank (a kill's leftovers: the writer truncates such a file whenever it writes that shard)."""
    for each in patterns:
        for path in (listed_shards(each, rank, world, parts=True) or {}).values():
            try:
                if stat.S_ISREG(os.lstat(path).st_mode):
                    os.remove(path)
            except FileNotFoundError:
                pass
    return []


def refuse_foreign_beside(pattern: str, rank: int, world: int, recorded: list[str], mtime: int) -> None:
    """Before a resume into a local folder: raises, naming them, where files named like this
    rank's shards are there that neither the record names (``recorded``: its shards' paths,
    in any state: a resume writes them again where they changed) nor the writer left (a
    shard renamed by a killed run before it was recorded has the writer's modification time)."""
    if url_scheme(pattern) != "file":
        return
    known = {os.path.abspath(url) for url in recorded}
    listed = (listed_shards(pattern, rank, world) or {}).values()
    refuse_foreign([url for url in listed if os.path.abspath(url) not in known], {}, {mtime})


def check_no_more_shards(pattern: str, rank: int, world: int, log, total: int,
                         stores: PipelineStores | None = None) -> None:
    """After a resume planned ``total`` shards: raises where the earlier run planned more, or
    left (recorded or not) a shard of this rank's numbers past ``total``: the input shrank or
    changed, and those shards hold samples it no longer has."""
    if not log.resumed:
        return
    why = "the input shrank or changed since the earlier run"
    again = "restart=True (--restart) writes everything again and removes the earlier run's shards"
    extra = {n: entry["scan"]["url"] for n, entry in dict.items(log.done) if n >= total}
    extra.update({n: url for n, url in (listed_shards(pattern, rank, world, stores) or {}).items() if n >= total})
    if extra:
        first = min(extra)
        raise ShardWriteError(f"{why}: it now plans {total} shards, but that run wrote shard {first} "
                              f"({extra[first]}; {len(extra)} such shards), with samples the input no longer has; "
                              f"{again}", shard=extra[first])
    if log.earlier_end is not None and log.earlier_end > total:
        raise ShardWriteError(f"{why}: that run planned {log.earlier_end} shards, the input now {total}; {again}",
                              shard=pattern % total)


__all__ = ["check_no_more_shards", "listed_shards", "refuse_foreign", "refuse_foreign_beside", "settle_earlier"]
