"""What a failed object-store call was: :class:`StoreFailure`, of one kind, told by :func:`classify`.

The kinds: a missing object, a missing bucket, access denied, missing or rejected
credentials, settings that cannot be used (found before any request), the object changed,
a range past the end, a request refused, and transient (the only kind retried). obstore's
exceptions are told apart by their type where obstore types them, else by the server's
words in their message; every message is redacted.
"""

from __future__ import annotations

import re

from ..errors import redact
from .cloud_env import ConfigError

# What a failure was, as the back end reports it.
MISSING_OBJECT, MISSING_BUCKET, DENIED, CREDENTIALS, CHANGED, PAST_END, REFUSED, TRANSIENT = (
    "missing object", "missing bucket", "access denied", "missing or rejected credentials",
    "the object changed", "range past the end", "request refused", "transient")
CONFIG = "store settings incomplete or not valid"  # found before any request: the store cannot be built
_CLIENT_ERROR = re.compile(r"status code: (4\d\d)")
_NOT_FOUND = re.compile(r"status code: 404\b")


class StoreFailure(Exception):
    """An obstore call failed: ``kind`` (one of the constants above) and obstore's message, redacted;
    where our own code saw the HTTP answer (:mod:`.signed_get`), its ``status`` and the
    seconds its ``Retry-After`` asked for (``retry_after``), else None."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after: float | None = None):
        super().__init__(kind, message)
        self.kind, self.message, self.status, self.retry_after = kind, message, status, retry_after

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


_BUCKET_MISSING = ("NoSuchBucket", "ContainerNotFound", "bucket does not exist", "specified bucket does not exist")
# A credential lookup that failed: the instance metadata service (its token or its
# credentials path), a key missing from the environment, a credentials file.
_NO_CREDENTIALS = ("/latest/api/token", "/latest/meta-data/iam", "missing accesskeyid", "missing secretaccesskey",
                   "credential", "metadata endpoint", "missing account", "service account", "token request",
                   "computemetadata")
# What obstore says of settings it cannot use (a key it does not know, a value that is
# required and missing): found before any request, so never a network failure.
_BAD_SETTINGS = ("must be specified", "configuration key")


def classify(exn: BaseException) -> StoreFailure:
    """``exn`` (what an obstore call raised) as a :class:`StoreFailure` of one kind.

    A missing key and a missing bucket are both FileNotFoundError in obstore: the server's
    error code in the message tells them apart. A failed credential lookup (no
    ``AWS_*`` variables, and no instance metadata service answering) is a GenericError
    naming the metadata endpoint or the credentials."""
    if isinstance(exn, StoreFailure):
        return exn
    name = type(exn).__name__
    message = words(exn)
    text = str(exn)
    lower = text.lower()
    if name == "PreconditionError":
        return StoreFailure(CHANGED, message)
    if name == "UnauthenticatedError":
        return StoreFailure(CREDENTIALS, message)
    if name == "UnknownConfigurationKeyError" or isinstance(exn, ConfigError) or (
            name in ("GenericError", "ValueError") and not _CLIENT_ERROR.search(text)
            and any(words in lower for words in _BAD_SETTINGS)):
        return StoreFailure(CONFIG, message)
    # before a 403: a metadata server's or token service's refusal means no credentials were
    # found, not that the store denied the ones it got (obstore types those: PermissionDeniedError)
    if name == "GenericError" and any(word in lower for word in _NO_CREDENTIALS):
        return StoreFailure(CREDENTIALS, message)
    if name == "PermissionDeniedError" or " 403 " in text:
        return StoreFailure(DENIED, message)
    if any(code.lower() in lower for code in _BUCKET_MISSING) or ("bucket" in lower and "does not exist" in lower):
        return StoreFailure(MISSING_BUCKET, message)
    if isinstance(exn, FileNotFoundError) or name == "NotFoundError":
        return StoreFailure(MISSING_OBJECT, message)
    if isinstance(exn, ImportError):
        raise exn
    status = _CLIENT_ERROR.search(text)
    if (status and status.group(1) == "416") or "wanted range starting at" in lower:  # Azure checks it itself
        return StoreFailure(PAST_END, message)
    if status and status.group(1) not in ("408", "429"):  # the server refuses: asking again changes nothing
        return StoreFailure(REFUSED, message)
    return StoreFailure(TRANSIENT, f"{name}: {message}")


def words(exn: BaseException) -> str:
    """obstore's message, without its debug dump, on one line, redacted."""
    return " ".join(redact(str(exn).split("\n\nDebug source:", 1)[0]).split())[:600]


def not_found(failure: StoreFailure) -> bool:
    """Whether the server answered 404 (a missing object, or to a listing a missing bucket):
    the kind, or the status in obstore's words, never a "404" in a URL or a bucket's name."""
    return failure.kind in (MISSING_OBJECT, MISSING_BUCKET) or bool(_NOT_FOUND.search(failure.message))
