"""The one exception tree of kvtide, split by what the caller can do about it.

KvtideError
├── ConfigError          bad flag, option, preset or file content given by the user
├── UsageError           the library called against its contract: a double unlock, a negative
│                        token count, a request at another block size than its router's
├── TraceFormatError     a trace line that cannot be read (carries path and line number)
├── CapacityError        a request that can never fit (larger than the whole cache)
├── RequestError         a request body a server cannot take (carries the field as ``param``)
├── UpstreamError        an engine behind the gateway failed
│   ├── UpstreamTimeout
│   └── UpstreamUnavailable
├── NoHealthyReplica     routing found no replica to send to
└── StateStoreError      the shared index store (Redis) failed
"""

from __future__ import annotations


class KvtideError(Exception):
    """Root of every error kvtide raises on purpose."""


class ConfigError(KvtideError):
    pass


class UsageError(KvtideError, ValueError):
    """A call that breaks the API's contract; fix the calling code.

    Also a ``ValueError``, which is what such calls raised before and what Python code
    catching bad values expects."""


class TraceFormatError(KvtideError):
    def __init__(self, path: str, line: int, problem: str) -> None:
        super().__init__(f"{path}:{line}: {problem}")
        self.path = path
        self.line = line
        self.problem = problem


class CapacityError(KvtideError):
    pass


class RequestError(KvtideError):
    """A field of a request body that is wrong: each server answers it with its own 400 body,
    ``param`` naming the field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UpstreamError(KvtideError):
    pass


class UpstreamTimeout(UpstreamError):
    pass


class UpstreamUnavailable(UpstreamError):
    pass


class NoHealthyReplica(KvtideError):
    pass


class StateStoreError(KvtideError):
    pass
