"""The two families of things that go wrong in an episode, kept apart on purpose.

A `ModelFault` is the model's doing: it becomes feedback, counts as a turn and is limited by
`max_consecutive_format_errors`. An `InfraFault` is ours or the provider's: it is retried or ends
the episode with a clear message, and is never scored as a model failure.
"""

from __future__ import annotations

from typing import Literal

from kloop.errors import KloopError

__all__ = ["KloopError"]


class ModelFault(KloopError):
    """The reply was unusable; the model is told why and tries again."""


class FormatError(ModelFault):
    """The reply could not be parsed as asked (e.g. an unterminated code block)."""


class NoKernelFound(ModelFault):
    """The reply holds no fenced python block with a kernel."""


class InfraFault(KloopError):
    """Something outside the model failed; never counted against the model."""


class EvalInfraError(InfraFault):
    """The evaluator's infrastructure failed (GPU unavailable, worker crash, lock timeout)."""


class ProviderError(InfraFault):
    """An LLM API call failed. `raw` is the response body, when there was one, for the log."""

    def __init__(self, message: str, *, raw: dict | None = None) -> None:
        super().__init__(message)
        self.raw = raw
        self.attempts = 1


AbortKind = Literal["auth", "bad_request", "context_length", "not_found", "quota", "config"]


class ProviderAbort(ProviderError):
    """Retrying cannot help (auth, bad request, context length, quota): the episode ends."""

    def __init__(self, message: str, *, kind: AbortKind = "bad_request", raw: dict | None = None):
        super().__init__(message, raw=raw)
        self.kind = kind


class ScriptExhausted(ProviderAbort):
    """A scripted or replayed model was asked for more replies than it holds."""

    def __init__(self, message: str) -> None:
        super().__init__(message, kind="config")


class ProviderRetryable(ProviderError):
    """Rate limit, 5xx, overload, timeout or a dropped connection: worth another try.

    `retry_after_s` is the server's own hint (retry-after / retry-after-ms), when it sent one.
    """

    def __init__(
        self, message: str, *, retry_after_s: float | None = None, raw: dict | None = None
    ):
        super().__init__(message, raw=raw)
        self.retry_after_s = retry_after_s
