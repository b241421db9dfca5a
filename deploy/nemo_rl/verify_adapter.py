"""Check gymserve's NeMo RL adapter inside your NeMo RL checkout, against a running gymserve head.

    cd NEMO_RL_CHECKOUT
    PYTHONPATH=GYMSERVE_CHECKOUT uv run python GYMSERVE_CHECKOUT/deploy/nemo_rl/verify_adapter.py \
        --head-url http://127.0.0.1:11000 --resource-server exact_match

It goes through NeMo RL's own code: `register` (register_env + ACTOR_ENVIRONMENT_REGISTRY),
`create_env` (the Ray actor with the registered Python executable), a training-style `step`, the
evaluation call with its third argument, the reward format the installed NeMo RL expects, and the
loud failure of a sample the environment cannot verify. It prints one line per check and exits 1
on the first failure. The row it sends is `{"expected_answer": ...}`, which `exact_match` and
`math` accept.
"""
from __future__ import annotations

import argparse
import sys


def _log(answer: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": "Answer with the word tac."}, {"role": "assistant", "content": answer}]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head-url", required=True)
    parser.add_argument("--resource-server", default="exact_match")
    parser.add_argument("--answer", default="tac", help="a correct answer for the row sent")
    args = parser.parse_args()

    import ray
    from nemo_rl.distributed.ray_actor_environment_registry import get_actor_python_env
    from nemo_rl.environments.utils import create_env

    from trainer.adapters.nemo_rl import ACTOR_FQN, detect_reward_format, register

    def check(what: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {what}{': ' + detail if detail else ''}")
        if not ok:
            raise SystemExit(1)

    register("gymserve_verify")
    check("create_env's actor registry knows the adapter", bool(get_actor_python_env(ACTOR_FQN)))
    check("reward format of this NeMo RL", True, detect_reward_format())
    ray.init(ignore_reinit_error=True, include_dashboard=False)
    try:
        env = create_env("gymserve_verify", {"head_url": args.head_url, "resource_server": args.resource_server})
        infos = [{"expected_answer": args.answer}] * 2
        result = ray.get(env.step.remote([_log(args.answer), _log(args.answer + "x")], infos))
        check("training step rewards", result.rewards.tolist() == [1.0, 0.0], str(result.rewards.tolist()))
        evaluated = ray.get(env.step.remote([_log(args.answer)], infos[:1], True))
        check("evaluation step (third argument, rewards.tolist())", evaluated.rewards.tolist() == [1.0])
        try:
            ray.get(env.step.remote([_log(args.answer)], [{}]))
        except Exception as exc:  # a Ray task error wrapping VerifyFailed
            check("an unverifiable sample fails the step", "VerifyFailed" in repr(exc) or "verified" in str(exc))
        else:
            check("an unverifiable sample fails the step", False, "step returned")
    finally:
        ray.shutdown()
    print("the gymserve adapter works with this NeMo RL")
    return 0


if __name__ == "__main__":
    sys.exit(main())
