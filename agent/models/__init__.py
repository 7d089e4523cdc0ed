"""Pick a provider by name: `get_model("openai:gpt-5", cfg)`.

Each registry entry is `module:callable`, called as `callable(name_after_colon, cfg)` and
returning a `Model`. Modules are imported on demand so that an SDK is only needed when used.
"""

from __future__ import annotations

import importlib

from kloop.agent.models.base import Message, Model, ModelConfig, ModelReply, Usage

__all__ = ["PROVIDERS", "Message", "Model", "ModelConfig", "ModelReply", "Usage", "get_model"]

PROVIDERS: dict[str, str] = {
    "openai": "kloop.agent.models.openai:OpenAIModel",
    "anthropic": "kloop.agent.models.anthropic:AnthropicModel",
    "scripted": "kloop.agent.models.scripted:ScriptedModel.from_spec",
    "replay": "kloop.agent.models.replay:ReplayModel.from_spec",
}


def get_model(spec: str, cfg: ModelConfig) -> Model:
    """The model named by `spec` ("provider:name"), configured by `cfg`."""
    provider, sep, arg = spec.partition(":")
    if not sep or not arg:
        raise ValueError(
            f"model spec {spec!r} must be provider:name, e.g. openai:gpt-5 ({_known()})"
        )
    if provider not in PROVIDERS:
        raise ValueError(f"unknown model provider {provider!r} in {spec!r} ({_known()})")
    module_name, _, attr = PROVIDERS[provider].partition(":")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    return target(arg, cfg)  # type: ignore[operator]


def _known() -> str:
    return "known providers: " + ", ".join(sorted(PROVIDERS))
