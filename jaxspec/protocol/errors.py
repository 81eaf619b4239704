"""The protocol's errors: each carries the gRPC status it maps to (`code`), so every
transport, in-process or gRPC, reports the same precise status (`ERRORS` maps a code back to
its error)."""

from __future__ import annotations


class VerifierError(Exception):
    """Base of protocol errors; `code` names the gRPC status it maps to."""

    code = "INTERNAL"


class InvalidArgument(VerifierError, ValueError):
    code = "INVALID_ARGUMENT"


class NotFound(VerifierError, KeyError):
    code = "NOT_FOUND"

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "not found"


class FailedPrecondition(VerifierError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(VerifierError):
    """Out of slots or queue space; `retry_after_s` hints when to try again."""

    code = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, retry_after_s: float = 0.05):
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unauthenticated(VerifierError):
    code = "UNAUTHENTICATED"


class PermissionDenied(VerifierError):
    code = "PERMISSION_DENIED"


class Unavailable(VerifierError):
    """The verifier went away or is draining: reopen (resume) the session, maybe elsewhere."""

    code = "UNAVAILABLE"


class DeadlineExceeded(VerifierError):
    code = "DEADLINE_EXCEEDED"


ERRORS: dict[str, type[VerifierError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        Unauthenticated,
        PermissionDenied,
        Unavailable,
        DeadlineExceeded,
    )
}
