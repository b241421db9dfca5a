"""equivalence_llm_judge against NeMo-Gym 0.7.0's own server of that name: both sides ask the same judges
(`models/stub` on 127.0.0.1: four fixed replies, equal, not equal, no label, both labels, and a scripted
one that says equal only to a whole multi-line response, and not equal when the swapped question puts
the row's answer last) about NeMo-Gym's example rows (its `example.jsonl` and `example_openqa.jsonl`,
the latter with per-row `template_metadata.output_regex`, and four rows made from them: an answer over
`extraction_length_threshold`, an `output_regex` that is not a regular expression, the answer only in
`metadata.expected_answer`, a question in text parts followed by an image-only turn), each with every
response of its recorded rollouts and generated ones.
Both sides run with NeMo-Gym's shipped config (`configs/equivalence_llm_judge.yaml`), with the swap
check, the full-generation rescue and an answer length limit on, and with its `configs/lc_judge.yaml`
(labels `CORRECT`/`INCORRECT`, each side's own defaults for the options it leaves out, under judges
that answer in those labels). The judge must be asked the same
questions in the same order, and the rewards must be equal, but for the intended difference: a judge
reply gymserve cannot read (no label, or both) masks the sample where NeMo-Gym scores it (0 for no
label, the last label for both).

NeMo-Gym's side runs its `LLMJudgeResourcesServer.verify` in its own virtualenv, with its own
`ServerClient` sending the judge calls (NeMo-Gym's model-server URL override points it at each stub)."""
from __future__ import annotations

import json
import re
from contextlib import ExitStack
from pathlib import Path

import pytest

from gymserve.testing import ServerProcess
from tests.compat.compat_page import compared
from tests.compat.nemo_gym import text_response

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

NEMO_VERIFY = """
import asyncio, os
from contextlib import nullcontext
from omegaconf import OmegaConf
from nemo_gym.server_utils import BaseServerConfig, ServerClient
from resources_servers.equivalence_llm_judge import app as eq
os.environ["NEMO_GYM_MODEL_SERVER_NAME"] = "judge"
client = ServerClient(head_server_config=BaseServerConfig(host="127.0.0.1", port=1),
                      global_config_dict=OmegaConf.create({}))
async def run(options, template, judge_url):
    os.environ["NEMO_GYM_MODEL_SERVER_BASE_URL"] = judge_url  # read on every request
    config = eq.LLMJudgeResourcesServerConfig(host="127.0.0.1", port=1, entrypoint="app.py",
        judge_model_server={"type": "responses_api_models", "name": "judge"},
        judge_responses_create_params={"input": []}, **options)
    server = eq.LLMJudgeResourcesServer.model_construct(config=config, server_client=client)
    server._judge_endpoint_max_concurrency = nullcontext()
    server._judge_prompt_template = template
    out = []
    for body in data["bodies"]:
        r = await server.verify(eq.LLMJudgeVerifyRequest.model_validate(body))
        out.append([r.reward, [e.verdict_label for e in r.judge_evaluations],
                    [e.responses_create_params.input[-1].content for e in r.judge_evaluations]])
    return out
async def main():
    return [await run(case["options"], case["template"], case["judge_url"]) for case in data["cases"]]
print(json.dumps(asyncio.run(main())))
"""

# NeMo-Gym's configs/equivalence_llm_judge.yaml, every option that decides a reward
SHIPPED: dict[str, object] = {
    "judge_system_message": None, "judge_equal_label": "[[A=B]]", "judge_not_equal_label": "[[A!=B]]",
    "question_extract_regex": None, "response_extract_regex": None, "check_twice_swap": False,
    "reward_if_swap_fails": 0.0, "use_per_record_regex": True, "extraction_length_threshold": None,
    "check_full_generation_on_fail": False, "reward_if_full_generation_succeeds": 0.0}
# the swap check, the rescue (NeMo-Gym's class defaults for it), an answer limit and both regexes on
CHECKED: dict[str, object] = {
    **SHIPPED, "check_twice_swap": True, "reward_if_swap_fails": -1.0, "extraction_length_threshold": 120,
    "check_full_generation_on_fail": True, "reward_if_full_generation_succeeds": 0.5, "max_answer_chars": 3000,
    "question_extract_regex": r"\n\n(.*)\Z", "response_extract_regex": r"\\boxed\{(.*)\}"}
# NeMo-Gym's configs/lc_judge.yaml: labels one inside the other, a question regex; the options it does not
# set are NeMo-Gym's defaults on its side and gymserve's on ours (the rescue with 0.5 among them)
LC: dict[str, object] = {
    "judge_system_message": None, "judge_equal_label": "CORRECT", "judge_not_equal_label": "INCORRECT",
    "check_twice_swap": False, "reward_if_swap_fails": 0.0, "question_extract_regex": r"^QUESTION:\s*(.*)$|</text>\n\n(.*)$",
    "response_extract_regex": None}
# config: (its options, its prompt template, the judges asked under it)
CONFIGS: dict[str, tuple[dict[str, object], str, list[str]]] = {
    "shipped": (SHIPPED, "equivalence_llm_judge.txt", ["equal", "not-equal", "no-label", "both-labels", "scripted"]),
    "checked": (CHECKED, "equivalence_llm_judge.txt", ["equal", "not-equal", "no-label", "both-labels", "scripted"]),
    "lc": (LC, "lc_judge.txt", ["correct", "incorrect", "both-lc", "scripted-lc"])}

# (judge, its one reply, whether gymserve reads a verdict from it)
FIXED = [("equal", "Both name the same thing.\n\n[[A=B]] they are equivalent", True),
         ("not-equal", "[[A!=B]] they are not equivalent", True),
         ("no-label", "I cannot tell.", False),
         ("both-labels", "[[A=B]] they are equivalent; no: [[A!=B]]", False),
         ("correct", "CORRECT", True), ("incorrect", "INCORRECT", True),
         ("both-lc", "INCORRECT. No, CORRECT", False)]


def _data_dir(nemo) -> Path:
    [data] = list(nemo.venv.glob("lib/python3.*/site-packages/resources_servers/equivalence_llm_judge"))
    return data


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _message(*texts: str) -> dict:
    return {"type": "message", "id": "msg_x", "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": text, "annotations": []} for text in texts]}


def _generated(expected: str) -> list[dict]:
    """Right, wrong, empty, very long, extractable by each answer format of the rows and not."""
    reasoning = {"type": "reasoning", "id": "rs_x", "summary": [{"type": "summary_text", "text": "thinking"}]}
    texts = [expected, f"Some reasoning.\n\n\\boxed{{{expected}}}", f"Work.\n\n<final_answer>{expected}</final_answer>",
             f"Work.\n\n(({expected}))", f"Work.\n\n**{expected}**", "Hmm.\n\n\\boxed{nothing}", "I do not know.",
             "", "   \n ", "step. " * 1000 + f"\n\n\\boxed{{{expected}}}",
             f"<final_answer>no</final_answer> then <final_answer>{expected}</final_answer>"]
    out = [text_response(text) for text in texts]
    base = text_response("")
    out.append({**base, "output": [_message("Reasoning first.", f"\\boxed{{{expected}}}")]})  # two text blocks
    out.append({**base, "output": [reasoning]})  # thinking only, no answer
    out.append({**base, "output": [reasoning, _message(f"\\boxed{{{expected}}}")]})
    return out


def _bodies(nemo) -> list[dict]:
    data = _data_dir(nemo) / "data"
    plain, openqa = _jsonl(data / "example.jsonl"), _jsonl(data / "example_openqa.jsonl")
    long_answer = "The phase portrait is symmetric under reflection across the X-axis, since the Hamiltonian " \
                  "depends on Y only through its square, so Y and -Y give the same energy."
    assert len(long_answer) > 120  # CHECKED's extraction_length_threshold
    made = [{**openqa[2], "expected_answer": long_answer},
            {**openqa[1], "template_metadata": {**openqa[1]["template_metadata"], "output_regex": "(["}},
            {**{k: v for k, v in plain[0].items() if k != "expected_answer"},
             "metadata": {"expected_answer": plain[0]["expected_answer"]}},
            {**plain[1], "responses_create_params": {"input": [  # a question in two text parts, then an image
                {"role": "user", "content": [{"type": "input_text", "text": "Answer briefly. "},
                                             {"type": "input_text", "text": plain[1]["question"]}]},
                {"role": "assistant", "content": "Which acids?"},
                {"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA==",
                                              "detail": "auto"}]}]}}]
    recorded = {id(row): [r["response"] for r in _jsonl(data / "example_rollouts.jsonl")] for row in plain}
    recorded.update({id(row): [r["response"] for r in _jsonl(data / "example_rollouts_openqa.jsonl")]
                     for row in openqa + made[:2]})
    recorded[id(made[2])] = recorded[id(made[3])] = recorded[id(plain[0])]
    rows = plain + openqa + made
    return [{**row, "response": response} for row in rows
            for response in recorded[id(row)] + _generated(row.get("expected_answer") or row["metadata"]["expected_answer"])]


def _scripted(bodies: list[dict]) -> list[dict]:
    """Rules of the scripted judge: not equal when a row's answer is the candidate after a multi-line GOLD (the
    swapped question about a whole response), equal to any other multi-line candidate (a whole response: the
    rescue question), not equal to the rest (a one-line answer, extracted or not)."""
    answers = sorted({b.get("expected_answer") or b["metadata"]["expected_answer"] for b in bodies})
    either = "|".join(map(re.escape, answers))
    return [{"match": rf"GOLD:\n[^\n]*\n[\s\S]*CANDIDATE:\n(?:{either})\Z", "text": "[[A!=B]] not the same"},
            {"match": r"CANDIDATE:\n[^\n]*\n[\s\S]*\Z", "text": "the same\n\n[[A=B]]"}]


def _scripted_lc() -> list[dict]:
    """CORRECT only for a multi-line candidate (a whole response: the rescue question)."""
    return [{"match": r"ASSESS: [^\n]*\n(?!\nReply only with CORRECT or INCORRECT\.\Z)", "text": "CORRECT"}]


def _options(options: dict[str, object]) -> list[str]:
    return [f"{key}={json.dumps(value)}" for key, value in options.items()]


def _prompts(reply: dict) -> list[str]:
    return [e["responses_create_params"]["input"][-1]["content"] for e in reply.get("judge_evaluations") or []]


def test_equivalence_rewards_equal_nemo_gyms(nemo, workdir):
    bodies = _bodies(nemo)
    templates = {config: (_data_dir(nemo) / "prompt_templates" / file).read_text().strip()
                 for config, (_, file, _) in CONFIGS.items()}
    judges = [(name, [f"text={json.dumps(reply)}"], readable) for name, reply, readable in FIXED]
    judges.append(("scripted", [f"text={json.dumps('[[A!=B]]')}", f"rules={json.dumps(_scripted(bodies))}"], True))
    judges.append(("scripted-lc", ["text=INCORRECT", f"rules={json.dumps(_scripted_lc())}"], True))
    cases = [(config, name) for config, (_, _, names) in CONFIGS.items() for name in names]
    with ExitStack() as stack:
        stubs = {name: ServerProcess("models/stub", *args, name=f"judge_{i}", env={"GYMSERVE_NO_AUTH": "1"})
                 for i, (name, args, _) in enumerate(judges)}
        ours_servers = {case: ServerProcess("resources/equivalence_llm_judge", f"judge_model_server={stubs[case[1]].url}",
                                            f"judge_prompt_template={json.dumps(templates[case[0]])}",
                                            "judge_deadline_s=60", "verify_deadline_s=120", *_options(CONFIGS[case[0]][0]),
                                            name=f"eq_{i}", ready_timeout_s=300)
                        for i, case in enumerate(cases)}
        for server in [*stubs.values(), *ours_servers.values()]:
            stack.callback(server.stop)
            server.launch()
        for server in [*stubs.values(), *ours_servers.values()]:
            server.wait_ready()
        theirs = nemo.python_json(NEMO_VERIFY, {"bodies": bodies, "cases": [
            {"options": CONFIGS[config][0], "template": templates[config], "judge_url": stubs[name].url}
            for config, name in cases]}, workdir)
        ours = {case: server.post("/verify/batch", bodies, timeout=300).json() for case, server in ours_servers.items()}
        # a row with no expected answer anywhere: a 400 naming the field (NeMo-Gym asks its judge with an empty GOLD)
        no_answer = {k: v for k, v in bodies[0].items() if k != "expected_answer"}
        bad = ours_servers[cases[0]].post("/verify", no_answer)
        assert bad.status_code == 400 and "expected_answer" in bad.text
    readable = {name: ok for name, _, ok in judges}
    compared_cases = 0
    for (config, judge), their_replies in zip(cases, theirs):
        masked = 0
        for body, mine, (their_reward, their_labels, their_prompts) in zip(bodies, ours[(config, judge)], their_replies):
            where = (config, judge, json.dumps(body["response"]["output"])[-120:])
            if mine.get("mask_sample"):
                # the intended difference: a reply without one clear verdict, where NeMo-Gym asked the same question
                assert not readable[judge] and mine["failure_kind"] == "upstream", (where, mine)
                assert "verdict label" in mine["failure_reason"], where
                assert their_prompts[:len(_prompts(mine))] == _prompts(mine) and their_prompts, where
                masked += 1
            else:
                assert mine["reward"] == their_reward, (where, mine["reward"], their_reward)
                assert [e["verdict_label"] for e in mine["judge_evaluations"]] == their_labels, where
                assert _prompts(mine) == their_prompts, where
            compared_cases += 1
        if not readable[judge]:  # every sample NeMo-Gym's judge was asked about is masked here, the rest are scored
            assert masked == sum(1 for _, _, prompts in their_replies if prompts) > 0
    checked = [r["reward"] for r in ours[("checked", "scripted")]]
    assert {1.0, 0.5, 0.0, -1.0} <= set(checked)  # the swap check failing and the rescue both happened
    assert 0.5 in {r["reward"] for r in ours[("lc", "scripted-lc")]}  # the rescue is on by default on both sides
    compared("equivalence_llm_judge", compared_cases)
