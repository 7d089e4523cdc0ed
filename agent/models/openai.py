"""`openai:<model>`: OpenAI and OpenAI-compatible servers, via Chat Completions or the Responses API.

Only the SDK's transport, auth and error types are used: replies are read from the JSON body
the server sent, so the log holds exactly that body and non-standard fields that compatible
servers add (`reasoning_content`, DeepSeek's `prompt_cache_hit_tokens`) are not lost.
"""

from __future__ import annotations

import os
import re

import openai
from kloop.agent.errors import ProviderAbort, ProviderRetryable
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

# OpenAI's reasoning families; the Responses API is the one that returns their reasoning summaries.
_REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")
_FINISH = {"function_call": "tool_calls"}


class OpenAIModel:
    """A chat model behind the OpenAI SDK. `model` is the name sent to the server."""

    def __init__(self, model: str, cfg: ModelConfig) -> None:
        self.model = model
        self.name = f"openai:{model}"
        self.cfg = cfg
        base_url = cfg.base_url or os.environ.get("OPENAI_BASE_URL") or None
        key = os.environ.get("OPENAI_API_KEY")
        if not key:
            if base_url is None:
                raise ProviderAbort("openai: OPENAI_API_KEY is not set; export it, or give --base-url "
                                    "for a local OpenAI-compatible server", kind="auth")
            key = "EMPTY"  # local compatible servers (vLLM, SGLang) accept any key
        self._client = openai.OpenAI(
            api_key=key, base_url=base_url, max_retries=0, timeout=cfg.timeout_s
        )
        self._slots = provider_slots("openai", base_url, cfg.concurrency)
        self._prices = load_prices(cfg.prices)
        # OpenAI itself rejects max_tokens for reasoning models; compatible servers may only know it.
        native = base_url is None or "api.openai.com" in base_url
        self._max_tokens_field = "max_completion_tokens" if native else "max_tokens"
        self._reasoning_model = bool(_REASONING_MODEL.match(model.lower().rsplit("/", 1)[-1]))
        if cfg.api == "auto":
            self.api = "responses" if cfg.reasoning_effort or self._reasoning_model else "chat"
        else:
            self.api = cfg.api

    def query(self, messages: list[Message], tools: list[ToolSpec] | None = None) -> ModelReply:
        return call_with_retries(lambda: self._once(messages, tools), self.cfg)

    def _once(self, messages: list[Message], tools: list[ToolSpec] | None) -> ModelReply:
        send, parse = (
            (self._chat, _parse_chat) if self.api == "chat" else (self._responses, _parse_responses)
        )
        return exchange("openai", lambda: send(messages, tools), parse,
                        (openai.APIStatusError, openai.APIConnectionError),
                        self._slots, self._prices, self.model)

    def _chat(self, messages: list[Message], tools: list[ToolSpec] | None):
        kwargs: dict = {
            "model": self.model,
            "messages": [_chat_message(m) for m in messages],
            self._max_tokens_field: self.cfg.max_output_tokens,
            "timeout": self.cfg.timeout_s,
        }
        if self.cfg.temperature is not None:
            kwargs["temperature"] = self.cfg.temperature
        if self.cfg.reasoning_effort:
            kwargs["reasoning_effort"] = self.cfg.reasoning_effort
        if tools:
            kwargs["tools"] = [{"type": "function", "function": t.model_dump()} for t in tools]
            # One call per step: each call is recorded, charged and resumed on its own.
            kwargs["parallel_tool_calls"] = False
        return self._client.chat.completions.with_raw_response.create(**kwargs)

    def _responses(self, messages: list[Message], tools: list[ToolSpec] | None):
        kwargs: dict = {
            "model": self.model,
            "input": [item for m in messages if m.role != "system" for item in _input_items(m)],
            "max_output_tokens": self.cfg.max_output_tokens,
            "store": False,  # the full history is sent every turn; nothing needs keeping server-side
            "timeout": self.cfg.timeout_s,
        }
        if system := "\n\n".join(m.content for m in messages if m.role == "system"):
            kwargs["instructions"] = system
        if self.cfg.temperature is not None:
            kwargs["temperature"] = self.cfg.temperature
        reasoning = {"effort": self.cfg.reasoning_effort} if self.cfg.reasoning_effort else {}
        if self.cfg.reasoning_summary and (reasoning or self._reasoning_model):
            reasoning["summary"] = self.cfg.reasoning_summary
        if reasoning:
            kwargs["reasoning"] = reasoning
        if tools:
            kwargs["tools"] = [{"type": "function", **t.model_dump()} for t in tools]
            kwargs["parallel_tool_calls"] = False
        return self._client.responses.with_raw_response.create(**kwargs)


def _chat_message(m: Message) -> dict:
    """A Chat Completions message: plain ones as before, tool calls and results in its shape."""
    if m.role == "tool":
        return {"role": "tool", "tool_call_id": m.tool_call_id, "content": m.content}
    out: dict = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["content"] = m.content or None
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in m.tool_calls]
    return out


def _input_items(m: Message) -> list[dict]:
    """Responses API input items: a message, or a call's output, or the calls themselves."""
    if m.role == "tool":
        return [{"type": "function_call_output", "call_id": m.tool_call_id, "output": m.content}]
    items = [{"role": m.role, "content": m.content}] if m.content or not m.tool_calls else []
    return items + [{"type": "function_call", "call_id": c.id, "name": c.name,
                     "arguments": c.arguments} for c in m.tool_calls]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _parse_chat(raw: dict) -> ModelReply:
    choice = raw["choices"][0]
    message = choice.get("message") or {}
    finish = choice.get("finish_reason")
    text = message.get("content") or ""
    if refusal := _text(message.get("refusal")):
        text, finish = text or refusal, "refusal"
    u = raw.get("usage") or {}
    prompt_details = u.get("prompt_tokens_details") or {}
    usage = Usage(
        input_tokens=u.get("prompt_tokens") or 0,
        output_tokens=u.get("completion_tokens") or 0,
        reasoning_tokens=(u.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0,
        cached_tokens=prompt_details.get("cached_tokens") or u.get("prompt_cache_hit_tokens") or 0,
    )
    calls = [ToolCall(id=c["id"], name=c["function"]["name"],
                      arguments=c["function"].get("arguments") or "{}")
             for c in message.get("tool_calls") or []]
    return ModelReply(
        text=text,
        tool_calls=calls,
        # vLLM/DeepSeek name it reasoning_content; newer vLLM and OpenRouter call it reasoning.
        reasoning=_text(message.get("reasoning_content")) or _text(message.get("reasoning")),
        usage=usage,
        cost_usd=None,
        finish_reason=_FINISH.get(finish, finish),
        latency_s=0.0,
        model=raw.get("model") or "",
        raw=raw,
    )


def _parse_responses(raw: dict) -> ModelReply:
    if raw.get("status") == "failed":
        raise ProviderRetryable(f"openai: the response failed: {raw.get('error')}", raw=raw)
    texts, thoughts, refusal, calls = [], [], None, []
    for item in raw["output"]:
        if item["type"] == "function_call":
            calls.append(ToolCall(id=item["call_id"], name=item["name"],
                                  arguments=item.get("arguments") or "{}"))
        if item["type"] == "message":
            for part in item.get("content") or []:
                if part["type"] == "output_text":
                    texts.append(part.get("text") or "")
                elif part["type"] == "refusal":
                    refusal = _text(part.get("refusal"))
        elif item["type"] == "reasoning":
            # summaries from OpenAI; full reasoning text from open-weight models served by vLLM
            parts = (item.get("summary") or []) + (item.get("content") or [])
            thoughts += [t for p in parts if (t := _text(p.get("text")))]
    finish = {"completed": "stop"}.get(raw.get("status"), raw.get("status"))
    if raw.get("status") == "incomplete":
        reason = (raw.get("incomplete_details") or {}).get("reason")
        finish = {"max_output_tokens": "length"}.get(reason, reason)
    if refusal:
        finish = "refusal"
    elif calls and finish == "stop":
        finish = "tool_calls"  # the Responses API says `completed` whether or not it called tools
    u = raw.get("usage") or {}
    usage = Usage(
        input_tokens=u.get("input_tokens") or 0,
        output_tokens=u.get("output_tokens") or 0,
        reasoning_tokens=(u.get("output_tokens_details") or {}).get("reasoning_tokens") or 0,
        cached_tokens=(u.get("input_tokens_details") or {}).get("cached_tokens") or 0,
    )
    return ModelReply(
        text="".join(texts) or refusal or "",
        tool_calls=calls,
        reasoning="\n\n".join(thoughts) or None,
        usage=usage,
        cost_usd=None,
        finish_reason=finish,
        latency_s=0.0,
        model=raw.get("model") or "",
        raw=raw,
    )
