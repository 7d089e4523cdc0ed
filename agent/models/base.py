"""What every provider speaks: messages in, a typed `ModelReply` out, configured by `ModelConfig`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Literal, Protocol

from kloop.agent.errors import ProviderRetryable
from kloop.agent.pricing import ModelPrice
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)


class ToolCall(BaseModel):
    """One tool call a model asked for (OpenAI function calling, Anthropic tool use)."""

    model_config = ConfigDict(extra="forbid")

    id: str
    """The provider's id for the call; its result is sent back under the same id."""
    name: str
    arguments: str
    """The arguments as JSON text, exactly as the model wrote them (they may not parse)."""


class ToolSpec(BaseModel):
    """A tool offered to the model: its name, what it does, and its arguments' JSON schema."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str
    parameters: dict
    """JSON schema of the arguments object."""


class Message(BaseModel):
    """One chat message. Several system messages are joined, in order, by the providers.

    A tool conversation adds two kinds: an assistant message with `tool_calls`, and a `tool`
    message holding one call's result under `tool_call_id`.
    """

    role: Literal["system", "user", "assistant", "tool"]
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None

    @model_serializer(mode="wrap")
    def _lean(self, handler: SerializerFunctionWrapHandler) -> dict:
        # A plain message is stored as {role, content}, as before tool calls existed: records
        # stay as small, and old and new ones read alike.
        data = handler(self)
        for key in ("tool_calls", "tool_call_id"):
            if not data.get(key):
                data.pop(key, None)
        return data


class Usage(BaseModel):
    """Token counts of one call, normalised across providers.

    `input_tokens` counts every prompt token, cached ones included (for Anthropic: input +
    cache reads + cache writes); `cached_tokens` is the part served from a prompt cache.
    `output_tokens` counts every generated token, reasoning included; `reasoning_tokens` is the
    part spent on reasoning (0 where the provider does not report it). So never add
    reasoning to output, and never add cached to input.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
        )


class ModelReply(BaseModel):
    """One model answer with everything the trajectory log and the budget meter need."""

    text: str
    """The visible answer ("" when the model returned no content)."""
    reasoning: str | None = None
    """Reasoning text where the API returns it (summaries, thinking blocks, reasoning_content)."""
    usage: Usage | None
    """None: unknown (an imported kernel, whose generating call was not recorded); never zeros
    standing in for unknown."""
    cost_usd: float | None
    """From the price table; None when the model is not in it (unknown is not free)."""
    finish_reason: str | None
    """Normalised: "stop", "length" (output cap hit), "refusal", "content_filter", "tool_calls";
    any other provider value passes through unchanged."""
    latency_s: float
    """Seconds of the successful HTTP call (retry waits not included)."""
    model: str
    """The model name the server reported (e.g. a dated snapshot), else the requested one."""
    raw: dict
    """The JSON body exactly as the server sent it (never request headers or the API key)."""
    retries: int = 0
    tool_calls: list[ToolCall] = Field(default_factory=list)
    """The tools the model asked to call, in its order (empty when it only wrote text)."""


class Address(BaseModel):
    """Where a query is asked: which problem, episode and turn (1-based)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    problem: str
    episode: int = Field(ge=0)
    turn: int = Field(ge=1)
    call: Literal["turn", "summary"] = "turn"
    """Which call of the turn: its query, or the summary of older turns made before it (the
    `summary` context policy)."""

    def __str__(self) -> str:
        where = f"{self.problem} episode {self.episode} turn {self.turn}"
        return where if self.call == "turn" else f"{where} ({self.call} call)"


class ModelConfig(BaseModel):
    """How to reach and drive one LLM."""

    model_config = ConfigDict(extra="forbid")

    spec: str
    """`provider:name`: "openai:gpt-5", "anthropic:claude-sonnet-4-5", "scripted:replies.yaml",
    "replay:runs/<id>"."""
    base_url: str | None = None
    """An OpenAI-compatible server (vLLM, SGLang, OpenRouter, DeepSeek…), e.g.
    http://localhost:8000/v1. OPENAI_BASE_URL is honoured when unset. For `anthropic:` it
    replaces the Anthropic endpoint."""
    temperature: float | None = None
    """Sampling temperature; None sends nothing (the server default)."""
    max_output_tokens: int = Field(8192, gt=0)
    """Cap on generated tokens per call, reasoning/thinking included."""
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    """OpenAI reasoning effort; setting it (with api="auto") selects the Responses API."""
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = "auto"
    """Responses API reasoning summary to request (some organisations must be verified by
    OpenAI to receive summaries: set None if the API refuses)."""
    api: Literal["auto", "chat", "responses"] = "auto"
    """OpenAI endpoint. auto: the Responses API for o1/o3/o4/gpt-5* names or when
    reasoning_effort is set, Chat Completions otherwise. Set "chat" for compatible servers
    without /responses (reasoning_effort is then sent as a Chat Completions field)."""
    thinking_budget_tokens: int | None = Field(None, ge=1024)
    """Anthropic extended thinking budget; must be below max_output_tokens."""
    timeout_s: float = Field(600, gt=0)
    """Per-request timeout; a timeout is retried like any transient failure."""
    max_retries: int = Field(6, ge=0)
    """Retries after the first attempt for transient failures (429, 5xx, 529, timeouts)."""
    retry_initial_wait_s: float = Field(1.0, ge=0)
    """First exponential backoff step; doubles per retry, plus up to as much jitter."""
    retry_max_wait_s: float = Field(60.0, ge=0)
    """Cap on one backoff wait (a server's retry-after may ask for longer, up to 10 minutes)."""
    concurrency: int = Field(4, ge=1)
    """Requests in flight at once per provider and base_url, across all episodes and threads."""
    prices: dict[str, ModelPrice] | Path | None = None
    """Price overrides: model name -> prices (merged over the packaged table), or the path of
    a JSON price table in the format of agent/prices.json (replaces it)."""


class Model(Protocol):
    """A chat model. Implementations raise `ProviderAbort` or `ProviderRetryable`, never SDK errors.

    `tools`, when given, are offered through the API's native tool calling; the calls the model
    makes come back in `ModelReply.tool_calls`.
    """

    name: str

    def query(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> ModelReply: ...


_slots: dict[tuple[str, str, int], threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


def provider_slots(
    provider: str, base_url: str | None, concurrency: int
) -> threading.BoundedSemaphore:
    """The semaphore shared by every model of one provider, endpoint and limit.

    All episodes of a run share one config, hence one semaphore; a model configured with a
    different limit (a fork with another config) gets its own.
    """
    key = (provider, base_url or "", concurrency)
    with _slots_lock:
        if key not in _slots:
            _slots[key] = threading.BoundedSemaphore(concurrency)
        return _slots[key]


def json_body(provider: str, text: str) -> dict:
    """The response body as a dict; a body that is not a JSON object is a transient fault."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ProviderRetryable(
            f"{provider}: the response body is not a JSON object",
            raw={"unparsed_body": text[:100_000]},
        )
    return body
