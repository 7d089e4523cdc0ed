"""One real call per provider. Skipped unless `--run-api` is given and the key is set.

Models can be changed with KLOOP_TEST_OPENAI_MODEL / KLOOP_TEST_ANTHROPIC_MODEL.
"""

import os

import pytest
from kloop.agent.models import Message, ModelConfig, get_model

MESSAGES = [
    Message(role="system", content="Answer with one word."),
    Message(role="user", content="What is the opposite of 'cold'?"),
]


@pytest.mark.api
@pytest.mark.parametrize(
    "spec, key, extra",
    [
        (
            f"openai:{os.environ.get('KLOOP_TEST_OPENAI_MODEL', 'gpt-5-mini')}",
            "OPENAI_API_KEY",
            {"reasoning_effort": "low"},
        ),
        (
            f"anthropic:{os.environ.get('KLOOP_TEST_ANTHROPIC_MODEL', 'claude-haiku-4-5')}",
            "ANTHROPIC_API_KEY",
            {"thinking_budget_tokens": 1024, "max_output_tokens": 2048},
        ),
    ],
)
def test_real_provider_round_trip(spec, key, extra):
    if not os.environ.get(key):
        pytest.skip(f"{key} is not set")
    reply = get_model(spec, ModelConfig(spec=spec, max_retries=2, **extra)).query(MESSAGES)
    assert "hot" in reply.text.lower()
    assert reply.usage.input_tokens > 0 and reply.usage.output_tokens > 0
    assert reply.finish_reason == "stop" and reply.raw
    assert reply.cost_usd is None or reply.cost_usd > 0
