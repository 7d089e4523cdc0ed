"""`anthropic:<model>`: Claude through the Messages API, with optional extended thinking.

As for OpenAI, only the SDK's transport, auth and error types are used; the reply is read from
the JSON body the server sent, which is what the log keeps.
"""

from __future__ import annotations

import json
import os

import anthropic
from kloop.agent.errors import ProviderAbort
from kloop.agent.models.base import (
    Message,
    ModelConfig,
    ModelReply,
    ToolCall,
    ToolSpec,
    Usage,
    provider_slots,
)
from kloop.agent.models.http import exchange
from kloop.agent.pricing import load_prices
from kloop.agent.retry import call_with_retries

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
}


class AnthropicModel:
    """A Claude model. `model` is the name sent to the API (an alias or a dated snapshot)."""

    def __init__(self, model: str, cfg: ModelConfig) -> None:
        budget = cfg.thinking_budget_tokens
        if budget is not None and budget >= cfg.max_output_tokens:
            raise ValueError(
                f"anthropic: thinking_budget_tokens ({budget}) must be below max_output_tokens "
                f"({cfg.max_output_tokens}): thinking counts towards the output cap"
            )
        if budget is not None and cfg.temperature is not None:
            raise ValueError("anthropic: temperature cannot be set together with extended thinking")
        self.model = model
        self.name = f"anthropic:{model}"
        self.cfg = cfg
        key = os.environ.get("ANTHROPIC_API_KEY")
        if not key:
            if cfg.base_url is None:
                raise ProviderAbort("anthropic: ANTHROPIC_API_KEY is not set; export it, or give "
                                    "--base-url for a gateway", kind="auth")
            key = "EMPTY"  # a local gateway may need none
        self._client = anthropic.Anthropic(
            api_key=key, base_url=cfg.base_url, max_retries=0, timeout=cfg.timeout_s
        )
        self._slots = provider_slots("anthropic", cfg.base_url, cfg.concurrency)
        self._prices = load_prices(cfg.prices)

    def query(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> ModelReply:
        return call_with_retries(lambda: self._once(messages, tools), self.cfg)

    def _once(self, messages: list[Message], tools: list[ToolSpec] | None) -> ModelReply:
        return exchange("anthropic", lambda: self._send(messages, tools), _parse,
                        (anthropic.APIStatusError, anthropic.APIConnectionError),
                        self._slots, self._prices, self.model)

    def _send(self, messages: list[Message], tools: list[ToolSpec] | None):
        kwargs: dict = {
            "model": self.model,
            "max_tokens": self.cfg.max_output_tokens,
            "messages": _messages(messages),
            # an explicit timeout also stops the SDK refusing long non-streaming requests
            "timeout": self.cfg.timeout_s,
        }
        if system := "\n\n".join(m.content for m in messages if m.role == "system"):
            kwargs["system"] = system
        if self.cfg.temperature is not None:
            kwargs["temperature"] = self.cfg.temperature
        if self.cfg.thinking_budget_tokens is not None:
            kwargs["thinking"] = {
                "type": "enabled",
                "budget_tokens": self.cfg.thinking_budget_tokens,
            }
        if tools:
            kwargs["tools"] = [{"name": t.name, "description": t.description,
                                "input_schema": t.parameters} for t in tools]
            # One call per step: each call is recorded, charged and resumed on its own.
            kwargs["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        return self._client.messages.with_raw_response.create(**kwargs)


def _messages(messages: list[Message]) -> list[dict]:
    """Messages API turns. Tool calls are `tool_use` blocks of the assistant's turn; their results
    are `tool_result` blocks of the user turn after it (consecutive results share one turn)."""
    out: list[dict] = []
    for m in messages:
        if m.role == "system":
            continue
        if m.role == "tool":
            block = {"type": "tool_result", "tool_use_id": m.tool_call_id, "content": m.content}
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m.tool_calls:
            text = [{"type": "text", "text": m.content}] if m.content else []
            out.append({"role": "assistant", "content": text + [
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _input(c.arguments)}
                for c in m.tool_calls]})
        else:
            out.append({"role": m.role, "content": m.content})
    return out


def _input(arguments: str) -> dict:
    """A call's arguments as the object the API takes back (what it sent was an object)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _parse(raw: dict) -> ModelReply:
    blocks = raw["content"]
    thoughts = [b["thinking"] for b in blocks if b["type"] == "thinking" and b.get("thinking")]
    u = raw["usage"]
    cache_read = u.get("cache_read_input_tokens") or 0
    # Anthropic's input_tokens excludes cache reads and writes; ours counts every prompt token.
    prompt = u["input_tokens"] + cache_read + (u.get("cache_creation_input_tokens") or 0)
    usage = Usage(
        input_tokens=prompt,
        output_tokens=u["output_tokens"],
        reasoning_tokens=(u.get("output_tokens_details") or {}).get("thinking_tokens") or 0,
        cached_tokens=cache_read,
    )
    stop = raw.get("stop_reason")
    calls = [ToolCall(id=b["id"], name=b["name"], arguments=json.dumps(b.get("input") or {}))
             for b in blocks if b["type"] == "tool_use"]
    return ModelReply(
        text="".join(b.get("text") or "" for b in blocks if b["type"] == "text"),
        tool_calls=calls,
        reasoning="\n\n".join(thoughts) or None,
        usage=usage,
        cost_usd=None,
        finish_reason=_FINISH.get(stop, stop),
        latency_s=0.0,
        model=raw.get("model") or "",
        raw=raw,
    )
