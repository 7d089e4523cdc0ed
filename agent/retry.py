"""The one place where LLM calls are retried, and the one rule for what is worth retrying.

SDK clients are built with max_retries=0; providers map SDK exceptions to `ProviderRetryable`
or `ProviderAbort` (via `classify_status` for HTTP errors) and call `call_with_retries`.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from kloop.agent.errors import ProviderAbort, ProviderError, ProviderRetryable
from kloop.agent.models.base import ModelConfig, ModelReply
from tenacity import (
    RetryCallState,
    Retrying,
    before_sleep_log,
    retry_if_exception_type,
    stop_after_attempt,
)

log = logging.getLogger(__name__)

MAX_RETRY_AFTER_S = 600.0
_CONTEXT = re.compile(
    r"context.length|context.window|maximum context|prompt is too long|too many tokens", re.I
)


def retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The server's requested wait from retry-after-ms or retry-after (seconds or HTTP date)."""
    if (ms := headers.get("retry-after-ms")) is not None:
        try:
            return max(float(ms) / 1000, 0.0)
        except ValueError:
            pass
    if (value := headers.get("retry-after")) is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        try:
            return max(parsedate_to_datetime(value).timestamp() - time.time(), 0.0)
        except (TypeError, ValueError):
            return None


def classify_status(
    provider: str, status: int, headers: Mapping[str, str], body: str
) -> ProviderError:
    """HTTP failure -> our family. 408/409/429/5xx (and 529 overload) retry; other 4xx abort."""
    try:
        raw = json.loads(body)
    except ValueError:
        raw = None
    raw = raw if isinstance(raw, dict) else {"unparsed_body": body[:10_000]}
    error = raw.get("error") if isinstance(raw.get("error"), dict) else raw
    message = error.get("message") if isinstance(error.get("message"), str) else body[:2000]
    code = str(error.get("code") or "")
    text = f"{provider}: HTTP {status}: {message}"
    if status == 429 and code == "insufficient_quota":
        return ProviderAbort(
            f"{text} (out of credit: add funds or change key)", kind="quota", raw=raw
        )
    if status in (408, 409, 429) or status >= 500:
        return ProviderRetryable(text, retry_after_s=retry_after_s(headers), raw=raw)
    if status in (401, 403):
        return ProviderAbort(f"{text} (check the API key and its access)", kind="auth", raw=raw)
    if status == 404:
        return ProviderAbort(
            f"{text} (check the model name and base URL)", kind="not_found", raw=raw
        )
    if status == 402:
        return ProviderAbort(text, kind="quota", raw=raw)
    if code == "context_length_exceeded" or _CONTEXT.search(message):
        return ProviderAbort(
            f"{text} (the prompt is too long for the model)", kind="context_length", raw=raw
        )
    return ProviderAbort(text, kind="bad_request", raw=raw)


def call_with_retries(call: Callable[[], ModelReply], cfg: ModelConfig) -> ModelReply:
    """Run `call`, retrying `ProviderRetryable` with capped exponential backoff and jitter.

    A server's retry-after is honoured as a lower bound on the wait (up to 10 minutes). The
    reply records how many retries it took; when they run out the last error is re-raised
    with `attempts` set.
    """

    def wait(state: RetryCallState) -> float:
        step = cfg.retry_initial_wait_s * 2 ** (state.attempt_number - 1)
        backoff = min(step, cfg.retry_max_wait_s) + random.uniform(0, cfg.retry_initial_wait_s)
        hint = getattr(state.outcome.exception(), "retry_after_s", None) if state.outcome else None
        return max(backoff, min(hint or 0.0, MAX_RETRY_AFTER_S))

    retrying = Retrying(
        retry=retry_if_exception_type(ProviderRetryable),
        wait=wait,
        stop=stop_after_attempt(cfg.max_retries + 1),
        before_sleep=before_sleep_log(log, logging.WARNING),
        reraise=True,
    )
    try:
        reply = retrying(call)
    except ProviderRetryable as e:
        e.attempts = retrying.statistics.get("attempt_number", 1)
        e.args = (f"{e.args[0]} (gave up after {e.attempts} attempts)",)
        raise
    return reply.model_copy(update={"retries": retrying.statistics["attempt_number"] - 1})
