"""The non-image fields: text, numbers, JSON, msgpack, cbor, arrays, tensors, tenbin, gzip, pickle.

Each decoder takes the field's bytes; those that may run code or allocate what a header
claims (npy, npz, pth, pickle) also take ``allow_pickle`` and the limits. The tables at
the end map a field's last dot-part to its decoder.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..limits import Limits

PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl"})

def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes, allow_pickle: bool, limits: Limits) -> np.ndarray:
    stream = io.BytesIO(data)
    _check_npy_header(stream, len(data), limits.max_array_bytes)
    stream.seek(0)
    return np.lib.format.read_array(stream, allow_pickle=allow_pickle)


def _check_npy_header(stream: Any, available: int, limit: int) -> None:
    """Raises ValueError where an npy header claims more bytes than ``limit``, or than the
    ``available`` bytes hold: numpy allocates the array before it reads the data."""
    version = np.lib.format.read_magic(stream)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(stream)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(stream)
    else:  # 3.0 (utf-8 field names): numpy reads it with the same private helper as the others
        shape, _, dtype = np.lib.format._read_array_header(stream, version)
    if dtype.hasobject:
        return  # pickled objects: only with allow_pickle, and no size to check
    claimed = math.prod(shape) * dtype.itemsize
    if claimed > limit:
        raise ValueError(f"the array is {shape} of {dtype}, {claimed} bytes: more than the limit of {limit} "
                         "(Limits.max_array_bytes)")
    if claimed > available - stream.tell():
        raise ValueError(f"the array header claims {shape} of {dtype}, {claimed} bytes; the data holds "
                         f"{available - stream.tell()}")


def _npz(data: bytes, allow_pickle: bool, limits: Limits) -> dict[str, np.ndarray]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        _check_npz(archive, limits.max_array_bytes)
    with np.load(io.BytesIO(data), allow_pickle=allow_pickle) as arrays:
        return dict(arrays)


def _check_npz(archive: zipfile.ZipFile, limit: int) -> None:
    """Raises ValueError where an npz unpacks to more than ``limit`` bytes (a zip bomb), or
    where an array's header claims more than its zip member holds."""
    members = archive.infolist()
    unpacked = sum(info.file_size for info in members)
    if unpacked > limit:
        raise ValueError(f"the npz unpacks to {unpacked} bytes: more than the limit of {limit} "
                         "(Limits.max_array_bytes)")
    for info in members:
        with archive.open(info) as member:
            if member.read(len(np.lib.format.MAGIC_PREFIX)) != np.lib.format.MAGIC_PREFIX:
                continue  # not an array: numpy returns its bytes
        with archive.open(info) as member:
            _check_npy_header(member, info.file_size, limit)


def _torch(data: bytes, allow_pickle: bool, limits: Limits) -> Any:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=not allow_pickle)


def gunzip(data: bytes, limit: int) -> bytes:
    """The bytes of a gzip field (concatenated members joined), at most ``limit`` of them."""
    out: list[bytes] = []
    total = 0
    while data:
        inflater = zlib.decompressobj(wbits=31)  # checks each member's CRC and length
        chunk = inflater.decompress(data, limit + 1 - total)
        total += len(chunk)
        if total > limit:
            raise ValueError(f"the gzip data unpacks to more than the limit of {limit} bytes (Limits.max_gz_bytes)")
        if not inflater.eof:
            raise ValueError("truncated gzip data")
        out.append(chunk)
        data = inflater.unused_data
    return b"".join(out)


def _unpickle(data: bytes, allow_pickle: bool, limits: Limits) -> Any:
    if not allow_pickle:
        raise ValueError(
            "pickled data can run arbitrary code when loaded, so it is refused; "
            "pass allow_pickle=True to decode() if you trust these shards"
        )
    return pickle.loads(data)


def _msgpack(data: bytes) -> Any:
    try:
        import msgpack
    except ImportError:
        raise ImportError("decoding msgpack fields needs the msgpack package: pip install msgpack") from None
    return msgpack.unpackb(data)


def _cbor(data: bytes) -> Any:
    try:
        import cbor2
    except ImportError:
        raise ImportError("decoding cbor fields needs the cbor2 package: pip install cbor2") from None
    return cbor2.loads(data)


def _tenbin(data: bytes) -> Any:
    from webdataset import tenbin

    return tenbin.decode_buffer(data)


_TEXT = ("txt", "text", "transcript")
_INT = ("cls", "cls2", "class", "count", "index", "inx", "id")
SAFE_DECODERS: dict[str, Callable[[bytes], Any]] = {
    **dict.fromkeys(_TEXT, _text),
    **dict.fromkeys(_INT, int),
    **dict.fromkeys(("json", "jsn"), _json),
    **dict.fromkeys(("mp", "msg", "msgpack"), _msgpack),
    "cbor": _cbor,
    **dict.fromkeys(("ten", "tb", "tenbin"), _tenbin),
}
# These take allow_pickle (object arrays, full torch.load and pickle only when it is True) and the limits.
TRUSTING_DECODERS: dict[str, Callable[[bytes, bool, Limits], Any]] = {
    "npy": _npy,
    "npz": _npz,
    "pth": _torch,
    **dict.fromkeys(PICKLE_EXTENSIONS, _unpickle),
}



# ------------------------------------------------------------ encoders, beside the decoders
# Keyed by the same suffix tuples as the decoders, so that what is written reads back as
# what it was (webdataset's writer keeps a second table, which drifted from its reader's).


def _text_out(value: Any) -> bytes:
    return str(value).encode("utf-8")


def _int_out(value: Any) -> bytes:
    if isinstance(value, bool) or int(value) != value:
        raise ValueError(f"an integer field takes an integer, not {value!r}")
    return str(int(value)).encode("ascii")


def _json_out(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")


def _msgpack_out(value: Any) -> bytes:
    try:
        import msgpack
    except ImportError:
        raise ImportError("encoding msgpack fields needs the msgpack package: pip install msgpack") from None
    return msgpack.packb(value)


def _cbor_out(value: Any) -> bytes:
    try:
        import cbor2
    except ImportError:
        raise ImportError("encoding cbor fields needs the cbor2 package: pip install cbor2") from None
    return cbor2.dumps(value)


def _npy_out(value: Any) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, np.asarray(value), allow_pickle=False)
    return out.getvalue()


def _npz_out(value: Any) -> bytes:
    out = io.BytesIO()
    np.savez(out, **value) if isinstance(value, dict) else np.savez(out, value)
    return out.getvalue()


def _torch_out(value: Any) -> bytes:
    out = io.BytesIO()
    torch.save(value, out)
    return out.getvalue()


SAFE_ENCODERS: dict[str, Callable[[Any], bytes]] = {
    **dict.fromkeys(_TEXT, _text_out),
    **dict.fromkeys(_INT, _int_out),
    **dict.fromkeys(("json", "jsn"), _json_out),
    **dict.fromkeys(("mp", "msg", "msgpack"), _msgpack_out),
    "cbor": _cbor_out,
    "npy": _npy_out,
    "npz": _npz_out,
    "pth": _torch_out,
}
# Written only when the writer is told allow_pickle=True (readers refuse them by default).
PICKLE_ENCODERS: dict[str, Callable[[Any], bytes]] = dict.fromkeys(PICKLE_EXTENSIONS, pickle.dumps)
