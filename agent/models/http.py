"""The one HTTP exchange every SDK-backed provider makes: send under the provider's concurrency
slots, map the SDK's errors to retryable or final faults, read the JSON body the server sent,
parse it into a `ModelReply`, and price it. Providers differ only in what they send and how
they parse."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from kloop.agent.errors import ProviderRetryable
from kloop.agent.models.base import ModelReply, json_body
from kloop.agent.pricing import PriceTable
from kloop.agent.retry import classify_status
from pydantic import ValidationError


def exchange(provider: str, send: Callable[[], Any], parse: Callable[[dict], ModelReply],
             errors: tuple[type[Any], type[Any]], slots: threading.BoundedSemaphore,
             prices: PriceTable, requested_model: str) -> ModelReply:
    """`send()` returns the SDK's raw-response wrapper; `errors` are the SDK's status-error and
    connection-error classes (timeouts are connection errors)."""
    status_error, connection_error = errors
    with slots:
        start = time.monotonic()
        try:
            text = send().http_response.text
        except status_error as e:
            raise classify_status(provider, e.status_code, e.response.headers, e.response.text) from e
        except connection_error as e:
            raise ProviderRetryable(f"{provider}: {type(e).__name__}: {e}") from e
        latency = time.monotonic() - start
    raw = json_body(provider, text)
    try:
        reply = parse(raw)
    except (KeyError, IndexError, TypeError, AttributeError, ValidationError) as e:
        raise ProviderRetryable(f"{provider}: unexpected response shape ({e!r})", raw=raw) from e
    model = reply.model or requested_model
    cost = None if reply.usage is None else prices.cost_usd(model, reply.usage)
    return reply.model_copy(update={"model": model, "cost_usd": cost, "latency_s": latency})
