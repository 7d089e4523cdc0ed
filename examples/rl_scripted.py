"""KernelEnv with a scripted policy: the loop an RL trainer runs, minus the training.

The policy is the demo's four replies written in advance (agent/demo/replies.yaml: a compile
error, a wrong result, a correct kernel, a faster one) for L3/1 at the demo's reduced size, so
the real evaluator judges them on CPU with the Triton interpreter: no GPU, no API key.

    python examples/rl_scripted.py [--steps 4] [--device cpu] [--speedup-weight 1.0]

A trainer would put its model where `policy` is and update it from the rewards.
"""

from __future__ import annotations

import argparse
import json

from kloop.agent.config import parse_layer, resolve
from kloop.agent.models.base import Message
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.rl import RewardConfig, make_env
from kloop.agent.run import DEMO_DIR


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--speedup-weight", type=float, default=1.0)
    args = ap.parse_args(argv)

    cfg = resolve([parse_layer(str(DEMO_DIR / "demo.yaml")),
                   {"model": {"spec": "scripted:policy"}, "eval": {"device": args.device},
                    "strategy": {"turns": args.steps}}])
    env = make_env(cfg, RewardConfig(speedup_weight=args.speedup_weight))
    replies = ScriptedModel.from_file(DEMO_DIR / "replies.yaml")

    def policy(observation: list[dict]) -> str:
        return replies.query([Message(**m) for m in observation]).text

    observation, info = env.reset(seed=0, options={"problem": "L3/1"})
    rows = []
    for _ in range(args.steps):
        observation, reward, terminated, truncated, info = env.step(policy(observation))
        result = info["eval"]
        rows.append({"turn": info["turn"], "status": info["status"], "reward": round(reward, 4),
                     "runtime_ms": result.runtime_ms if result else None,
                     "terminated": terminated, "truncated": truncated})
        print(json.dumps(rows[-1]))
        if terminated or truncated:
            break
    best = info["best"]
    print(json.dumps({"best_turn": best.turn if best else None,
                      "best_runtime_ms": best.runtime_ms if best else None}))
    return rows


if __name__ == "__main__":
    main()
