"""Inputs as samples for :func:`~wds_datapipes.writing.write_shards`: folder trees, ImageFolder
trees, JSONL/CSV manifests and existing shards.

Each yields sample dicts in a deterministic order (sorted names, manifest order, shard
order), with ``__source__`` naming the input in errors and in the report. Files become
:class:`~wds_datapipes.writing.shard_file.FileBytes` fields (copied by the OS, never read
here). An input that cannot become a proper sample (two files for one field of a key, a
manifest line without a key) carries its reasons in ``__problems__``: the writer hands
those to its handler (an error naming the input, or a listed skip).
"""

from __future__ import annotations

import csv
import errno
import fnmatch
import io
import json
import logging
import os
import stat
from collections.abc import Iterable, Iterator, Sequence

from ..errors import ShardWriteError
from ..shards.keys import group_members
from ..shards.openers import list_urls, open_shard
from ..shards.url_specs import expand_url_spec
from ..storage.cloud_settings import PipelineStores, StoreArg, with_stores
from ..tar import iter_tar_members
from .shard_file import PROBLEMS, FileBytes

logger = logging.getLogger("wds_datapipes")


# torchvision's ImageFolder takes files with these extensions (torchvision.datasets.folder.IMG_EXTENSIONS)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_OUTSIDE = "refused by default; --allow-outside or allow_outside=True takes it: see docs/security.md"


def _inside(path: str, root: str) -> bool:
    """Whether the resolved ``path`` is ``root`` (resolved) or under it."""
    return path == root or path.startswith(root if root.endswith(os.sep) else root + os.sep)


def _entry_problem(entry: os.DirEntry, root: str, allow_outside: bool) -> str | None:
    """Why a folder's entry cannot be taken, or None: a symbolic link that leads nowhere, one
    that leads outside ``root`` (a resolved path; unless ``allow_outside``), or neither a
    file nor a folder (a FIFO, a socket, a device: a copy could wait forever or read garbage)."""
    if entry.is_symlink():
        target = os.path.realpath(entry.path)
        if not os.path.exists(target):
            try:
                os.stat(entry.path)
            except OSError as exn:
                if exn.errno == errno.ELOOP:
                    return f"a symbolic link to {os.readlink(entry.path)!r}, which leads round a loop of links (a link loop)"
            return f"a symbolic link to {os.readlink(entry.path)!r}, which does not exist (a dangling link)"
        if not allow_outside and not _inside(target, root):
            return f"a symbolic link to {target!r}, outside the input folder {root!r} ({_OUTSIDE})"
    if not entry.is_dir() and not entry.is_file():
        return "not a regular file nor a folder (a FIFO, socket or device)"
    return None


def _folder_like(entry: os.DirEntry) -> bool:
    """Whether an entry is, or may have been, a folder: a folder, a link to one, or a link to
    nothing (or round a loop) whose name has no dot (``images -> /mnt/gone/images``). A link
    not followed is reported when it is folder-like, whatever its name, as the files in it
    would have been."""
    if entry.is_symlink() and not os.path.exists(entry.path):  # (is_dir() raises for a link loop)
        return "." not in entry.name
    return entry.is_dir()


def _files(folder: str, root: str, allow_outside: bool = False, within: tuple[str, ...] = (),
           hidden: list[str] | None = None) -> Iterator[tuple[str, os.DirEntry, str | None]]:
    """(path relative to ``folder``, entry, why it cannot be taken or None) of every file under
    ``folder``, sorted, hidden ones left out (their paths added to ``hidden`` where given; a
    hidden folder's, not its files'). Symbolic links are followed inside ``root`` (a resolved
    path); one leading outside it, one leading nowhere and a link back into a folder being
    listed (a loop) come with their reason, as does anything that is not a file."""
    within = within or (os.path.realpath(folder),)
    with os.scandir(folder) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if entry.name.startswith("."):
            if hidden is not None:
                hidden.append(entry.path)
            continue
        problem = _entry_problem(entry, root, allow_outside)
        if problem is None and entry.is_dir():
            real = os.path.realpath(entry.path) if entry.is_symlink() else os.path.join(within[-1], entry.name)
            if real in within:
                problem = f"a symbolic link back to the folder {real!r} it stands in (a loop)"
            else:
                for relative, inner, why in _files(entry.path, root, allow_outside, (*within, real), hidden):
                    yield os.path.join(entry.name, relative), inner, why
                continue
        yield entry.name, entry, problem


def read_fields_file(path: str, names: Sequence[str]) -> dict[str, dict]:
    """Per key, its fields from a whitespace-separated list file (``key v1 v2 ...``, ``#`` comments:
    the Oxford-IIIT Pets ``annotations/list.txt``), as text: a column named ``cls`` reads
    back as an int, any other as its suffix's decoder reads it."""
    fields: dict[str, dict] = {}
    with open(path) as lines:
        for line in lines:
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            fields[parts[0]] = dict(zip(names, parts[1:]))
    return fields


def folder_samples(root: str, *, extensions: Iterable[str] | None = None, fields_file: str | None = None,
                   field_names: Sequence[str] = (), allow_outside: bool = False) -> Iterator[dict]:
    """Samples of files grouped by basename across a tree (``images/a.jpg`` and
    ``annotations/trimaps/a.png`` make sample ``a`` with fields ``jpg`` and ``png``), in
    key order; the suffix is what follows the basename's first dot. ``extensions``: only
    files whose suffix is one of these. ``fields_file`` (with ``field_names``): more fields
    per key from a list file. A symbolic link that leads nowhere or outside ``root`` (unless
    ``allow_outside``), a link loop and anything that is not a file make their sample a bad
    input (an error naming the path, or a listed skip); a link to a folder, or to nothing
    with no dot in its name (it may have been a folder), whatever ``extensions`` says."""
    wanted = None if extensions is None else {e.lower().lstrip(".") for e in extensions}
    skip = os.path.abspath(fields_file) if fields_file else None
    inside = os.path.realpath(root)
    groups: dict[str, dict] = {}
    for relative, entry, problem in _files(root, inside, allow_outside):
        if skip is not None and os.path.abspath(entry.path) == skip:
            continue
        key, dot, suffix = entry.name.partition(".")
        folder = problem is not None and _folder_like(entry)  # a link not followed: reported whatever its name
        if not dot and not folder:
            continue
        if wanted is not None and suffix.lower() not in wanted and not folder:
            stem, _, extension = entry.name.rpartition(".")
            if extension.lower() in wanted:  # a dot in the basename (photo.v2.jpg): not silently left out
                why = (f"a dot in its basename: readers would split {entry.name!r} into the key {key!r} and the "
                       f"field {suffix.lower()!r}, not the key {stem!r} and the field {extension.lower()!r}")
                groups.setdefault(stem, {"__key__": stem, "__source__": os.path.join(root, relative), PROBLEMS: [why]})
            continue
        sample = groups.setdefault(key, {"__key__": key, "__source__": os.path.join(root, relative)})
        if problem is not None:
            sample.setdefault(PROBLEMS, []).append(f"{entry.path}: {problem}")
            continue
        if suffix.lower() in sample:
            sample.setdefault(PROBLEMS, []).append(
                f"two files for field {suffix.lower()!r}: {sample[suffix.lower()].path} and {entry.path}")
            continue
        sample[suffix.lower()] = FileBytes(entry.path, entry.stat().st_size)
    extra = read_fields_file(fields_file, field_names) if fields_file else {}
    for key in sorted(groups):
        sample = groups[key]
        sample.update(extra.get(key, {}))
        yield sample


def imagefolder_samples(root: str, *, extensions: Iterable[str] = IMAGE_EXTENSIONS, allow_outside: bool = False,
                        left_out: list[str] | None = None) -> Iterator[dict]:
    """Samples of an ImageFolder tree: each subfolder a class (numbered in sorted order, as
    torchvision does), each image in it a sample ``<class>/<name>`` with its image field and
    ``cls``. Only files with an image extension are taken (``extensions``: torchvision's
    ``IMG_EXTENSIONS`` by default, compared lowercased); the paths of the others, of files
    beside the class folders and of hidden files and folders (``.ipynb_checkpoints``, which
    torchvision would take as a class) go to ``left_out`` where given, else to one warning
    in the log. A file name with more than one dot makes a key with a dot; a symbolic link
    that leads nowhere or outside ``root`` (unless ``allow_outside``), a link loop and
    anything that is not a file are bad inputs: reported by the writer (an error, or a
    listed skip). A link to nothing named like a class folder (no dot) is such a class: it
    keeps its number, so skipping it leaves the other classes' numbers as they were."""
    suffixes = tuple(e.lower() if e.startswith(".") else f".{e.lower()}" for e in extensions)
    inside = os.path.realpath(root)
    dropped: list[str] = []
    with os.scandir(root) as scan:
        everything = sorted(scan, key=lambda e: e.name)
    entries = [e for e in everything if not e.name.startswith(".")]
    dropped += [e.path for e in everything if e.name.startswith(".")]
    # as torchvision's find_classes (links to folders too), and links to nothing that may have been folders
    classes = [e for e in entries if _folder_like(e)]
    dropped += [e.path for e in entries if e not in classes]  # beside the classes: torchvision takes none
    for number, folder in enumerate(classes):
        problem = _entry_problem(folder, inside, allow_outside)
        if problem is not None:
            yield {"__key__": folder.name, "__source__": folder.path, PROBLEMS: [f"{folder.path}: {problem}"]}
            continue
        for relative, entry, why in _files(folder.path, inside, allow_outside,
                                           (inside, os.path.realpath(folder.path)), dropped):
            unlisted = why is not None and _folder_like(entry)  # not followed: reported whatever its name
            if not entry.name.lower().endswith(suffixes) and not unlisted:
                dropped.append(entry.path)
                continue
            stem, dot, extension = relative.rpartition(".")
            sample = {"__key__": f"{folder.name}/{stem if dot else relative}", "__source__": entry.path, "cls": number}
            if why is not None:
                sample[PROBLEMS] = [f"{entry.path}: {why}"]
            else:
                sample[extension.lower()] = FileBytes(entry.path, entry.stat().st_size)
            yield sample
    if left_out is not None:
        left_out += dropped
    elif dropped:
        logger.warning("%s: left out %d file(s) or folder(s): hidden, beside the class folders, or not images "
                       "(extensions %s): %s%s", root, len(dropped), ", ".join(suffixes), ", ".join(dropped[:10]),
                       ", ..." if len(dropped) > 10 else "")


def path_field(base: str, path: str, root: str, allow_outside: bool = False) -> FileBytes:
    """The file that ``path`` (a manifest's or a Parquet row's, relative to ``base``) names,
    resolved (symbolic links followed), as a field's :class:`FileBytes`.

    Raises :class:`ValueError` naming the path where it resolves outside ``root`` (a resolved
    folder; unless ``allow_outside``): an absolute path, a ``..``, or a link that leads out;
    or where it is not a regular file (a folder; a FIFO, whose copy would wait forever);
    :class:`OSError` where it cannot be read."""
    real = os.path.realpath(os.path.join(base, path))
    if not allow_outside and not _inside(real, root):
        leads = "is" if real == path else f"resolves to {real!r},"
        raise ValueError(f"{path!r} {leads} outside the input's folder {root!r} ({_OUTSIDE})")
    found = os.stat(real)
    if not stat.S_ISREG(found.st_mode):
        kind = "a folder" if stat.S_ISDIR(found.st_mode) else "a FIFO, socket or device"
        raise ValueError(f"{path!r} is {kind}, not a regular file")
    return FileBytes(real, found.st_size)


def manifest_samples(path: str, *, allow_outside: bool = False) -> Iterator[dict]:
    """Samples of a JSONL or CSV manifest: one line a sample, its key in ``__key__`` or
    ``key``; a column ``<suffix>_path`` names a file (relative to the manifest) that
    becomes field ``<suffix>``; other columns are values, encoded by their suffix. A path
    that resolves outside the manifest's folder (absolute, ``..``, a symbolic link leading
    out) makes its line a bad input, unless ``allow_outside``."""
    base = os.path.dirname(os.path.abspath(path))
    root = os.path.realpath(base)
    if path.endswith(".csv"):
        rows: Iterable = list(csv.DictReader(io.StringIO(_utf8_text(path), newline="")))
        lines: Iterable[tuple[str, object, str | None]] = ((f"{path}:{n + 2}", row, None)
                                                           for n, row in enumerate(rows))
    else:
        lines = _jsonl(path)
    for where, row, unread in lines:
        if unread is not None or not isinstance(row, dict):
            yield {"__source__": where, PROBLEMS: [unread or f"not a JSON object: {row!r}"]}
            continue
        key = row.get("__key__", row.get("key"))
        sample: dict = {"__key__": key, "__source__": where}
        if key in (None, ""):
            sample[PROBLEMS] = ["no key (a __key__ or key column)"]
        for name, value in row.items():
            if name in ("__key__", "key") or value in (None, ""):
                continue
            if name.endswith("_path"):
                try:
                    sample[name[:-5]] = path_field(base, str(value), root, allow_outside)
                except ValueError as exn:
                    sample.setdefault(PROBLEMS, []).append(f"field {name[:-5]!r}: {exn}")
                except OSError as exn:
                    sample.setdefault(PROBLEMS, []).append(f"field {name[:-5]!r}: cannot read "
                                                           f"{os.path.join(base, str(value))!r} ({exn.strerror or exn})")
            else:
                sample[name] = value
        yield sample


def _utf8_text(path: str) -> str:
    """A manifest's text; raises :class:`~wds_datapipes.errors.ShardWriteError` naming the
    file and the line where it is not UTF-8 (before any sample of it is planned)."""
    with open(path, "rb") as stream:
        data = stream.read()
    try:
        return data.decode("utf-8-sig")  # a byte order mark (Excel's "CSV UTF-8") is not in the first name
    except UnicodeDecodeError as exn:
        line = data.count(b"\n", 0, exn.start) + 1
        raise ShardWriteError(f"the manifest is not UTF-8 text: line {line} has the byte "
                              f"0x{data[exn.start]:02x} ({exn.reason})", source=f"{path}:{line}") from None


def _jsonl(path: str) -> Iterator[tuple[str, object, str | None]]:
    """(``path:line``, the line's JSON value, None), or (``path:line``, None, why it cannot
    be read: bad JSON, not UTF-8), of each line that is not blank."""
    with open(path, "rb") as lines:
        for number, raw in enumerate(lines, 1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a byte order mark is no JSON
            except UnicodeDecodeError as exn:
                yield f"{path}:{number}", None, (f"not UTF-8 text: the byte 0x{raw[exn.start]:02x} at {exn.start} "
                                                 f"({exn.reason})")
                continue
            if line.strip():
                try:
                    yield f"{path}:{number}", json.loads(line), None
                except ValueError as exn:
                    yield f"{path}:{number}", None, f"bad JSON ({exn})"


def shard_samples(specs: Iterable[str], keys: str | None = None, where: Sequence[str] = (),
                  select: Sequence[str] | None = None, store: StoreArg = None) -> Iterator[dict]:
    """The samples of existing shards (URL specs: braces, globs, folders; several are
    concatenated in their order), in shard order, their fields as bytes. ``keys``: only keys
    matching this glob; ``where``: only samples passing each test (``name``: it has the
    field; ``name=value``: the field's text is ``value``; ``name!=value``); ``select``: only
    these fields (a sample left without any is dropped). ``store``: object-store settings
    for the ``s3://``, ``gs://``, ``az://`` shards (a glob or prefix of them is listed), as
    ``ShardLister``'s."""
    tests = [_field_test(text) for text in where]
    stores = PipelineStores.of(store)
    for spec in specs:
        for expanded in expand_url_spec(spec):
            for url in list_urls(with_stores(expanded, stores)):
                stream = open_shard(url)
                try:
                    for sample in group_members(url, iter_tar_members(stream, url)):
                        if keys is not None and not fnmatch.fnmatchcase(sample["__key__"], keys):
                            continue
                        if not all(test(sample) for test in tests):
                            continue
                        if select is not None:
                            sample = {k: v for k, v in sample.items() if k.startswith("_") or k in select}
                            if all(k.startswith("_") for k in sample):
                                continue
                        sample["__source__"] = f"{url}:{sample['__key__']}"
                        del sample["__url__"]
                        yield sample
                finally:
                    stream.close()


def _field_test(text: str):
    """A test of a sample's fields: ``name`` (present), ``name=value`` or ``name!=value`` (its UTF-8 text)."""
    for operator in ("!=", "="):
        name, found, value = text.partition(operator)
        if found:
            name = name.strip().lower()
            if operator == "=":
                return lambda sample: name in sample and _text(sample[name]) == value
            return lambda sample: name not in sample or _text(sample[name]) != value
    name = text.strip().lower()
    return lambda sample: name in sample


def _text(value: object) -> str:
    return bytes(value).decode("utf-8", "replace").strip() if isinstance(value, (bytes, bytearray, memoryview)) \
        else str(value)


__all__ = ["IMAGE_EXTENSIONS", "folder_samples", "imagefolder_samples", "manifest_samples", "path_field",
           "read_fields_file", "shard_samples"]
