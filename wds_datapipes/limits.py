"""Limits on what one shard, member or field may cost, and the timeouts of stalled streams: one place.

Shards come from strangers. A tar header, a PAX record, a gzip stream or an image header
can claim any size; these limits decide how much a claim is allowed to cost before it
ends in an error naming the shard and the member (or the sample and the field). With the
defaults, no single bad member, field or image raises a process's peak memory by more
than about 512 MB (tests/test_limits.py checks this under an address-space limit).

The values are read once, when a pipe is built, and travel with it to worker processes.
Change them before building the pipeline::

    import wds_datapipes as wd
    wd.set_limits(max_member_bytes=1 << 30, http_timeout=120)   # returns the previous Limits

or give a pipe its own: ``load_tar(limits=wd.get_limits().replace(max_member_bytes=1 << 30))``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, cast

__all__ = ["Limits", "get_limits", "set_limits"]

MiB = 1 << 20


@dataclass(frozen=True)
class Limits:
    """How much one member, field or image may cost, and how long a stalled stream may wait.

    Attributes:
        max_member_bytes: the largest tar member read into memory (a sparse member counts
            at its full size, holes included). Default 128 MiB; raise it for video shards.
        max_header_bytes: the largest PAX extended header, GNU long name or GNU sparse map
            of one member (default 1 MiB; real ones are a few hundred bytes, with extended
            attributes a few KiB).
        max_gz_bytes: the largest decompressed ``.gz`` field (``json.gz``, ``npy.gz``, ...):
            default 128 MiB.
        max_image_pixels: the largest image decoded, in pixels (width x height): default
            2**24 (4096 x 4096), which bounds the worst spec (float RGBA) near 400 MB.
        max_array_bytes: the largest ``.npy`` array, and the most an ``.npz`` holds once
            unpacked (all its arrays together): default 128 MiB.
        http_timeout: seconds an ``http(s)://`` read (or the wait for the response) may
            stall before it counts as a dropped connection: default 30.
        http_retries: how often in a row an HTTP (or object-store) stream reconnects (a
            Range request from the byte it reached) after a drop, a reset or a stall without
            a byte arriving before giving up: default 5, with waits of 0.5, 1, 2, 4, 8 s
            between tries; bytes that arrive start the count again
            (``wds_datapipes.storage.retry.RetryPolicy.for_limits``).
        pipe_grace: seconds a ``pipe:`` command may run on after its output was read to the
            end; then it is stopped and reported: default 10. A command whose output the
            reader closes before its end (it is done: end of archive, a span's end, a
            ``break``) is stopped at once, and that is no error.
        pipe_timeout: seconds a ``pipe:`` command may write nothing while its shard is read
            (a hung download); then it is stopped and the read fails naming it: default 120
            (0: wait for ever).
        max_media_seconds: the longest audio or video decoded (the clip, where one is asked
            for), in seconds: default 3600.
        max_video_frames: the most frames decoded from one video field: default 2048.
        max_frame_pixels: the largest video frame decoded, in pixels (width x height):
            default 2**23 (4K UHD, 3840 x 2160, fits).
        max_media_bytes: the most one audio or video field may take while it is decoded:
            default 256 MiB. A video's frames (frames x 3 x pixels) are decoded into one
            tensor; audio (float32 samples x channels) costs ``AUDIO_COPIES`` times its
            size (wds_datapipes/decoding/media.py: 2.5 through FFmpeg, which holds the
            decoded frames and their concatenation, 1 through TorchCodec's WAV reader, plus
            1/channels to mix to mono; measured 2.06-2.27, 2.57 to mono, and 1.0-1.5), so 256 MiB allows
            about 838 s of 16 kHz stereo through FFmpeg. All four are checked from the
            container's metadata before anything is decoded.
    """

    max_member_bytes: int = 128 * MiB
    max_header_bytes: int = 1 * MiB
    max_gz_bytes: int = 128 * MiB
    max_image_pixels: int = 1 << 24
    max_array_bytes: int = 128 * MiB
    http_timeout: float = 30.0
    http_retries: int = 5
    pipe_grace: float = 10.0
    pipe_timeout: float = 120.0
    max_media_seconds: float = 3600.0
    max_video_frames: int = 2048
    max_frame_pixels: int = 1 << 23
    max_media_bytes: int = 256 * MiB

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"Limits.{field.name} must be a number >= 0, not {value!r}")

    def replace(self, **changes: float) -> Limits:
        """A copy with ``changes`` applied (unknown names raise TypeError)."""
        return dataclasses.replace(self, **cast("dict[str, Any]", changes))  # __post_init__ checks each


_current = Limits()


def get_limits() -> Limits:
    """The limits that pipes built from now on take (see :class:`Limits`)."""
    return _current


def set_limits(limits: Limits | None = None, **changes: float) -> Limits:
    """Set the process's limits for pipes built from now on; returns the previous ones.

    Pass a whole :class:`Limits`, or only the values to change
    (``set_limits(max_image_pixels=50_000_000)``).
    """
    global _current
    previous = _current
    _current = (limits or previous).replace(**changes)
    return previous
