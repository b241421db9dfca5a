"""Per-kind conformance: what a resource server, an agent, a model server and the head must do."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import yaml

from gymserve.testing import ServerProcess
from services.core.config import ConfigError
from services.core.judge import JudgeConfig
from services.core.loader import available_kinds, is_package_kind, load_server, package_family

from . import bindings, generic
from .probe import Probe
from .report import CheckFailed, Report, expect
from .rows import REPO, answer_text, check_verify_reply, example_files, example_rows, response_with_text, verify_body
from .servers import Servers, servers

ROW_LIMIT = 5  # example rows verified per environment (enough to catch shape errors, cheap on CI)
AGENT_ENV = "exact_match"  # the environment an agent under check runs against


def run_check(kind: str, options: list[str]) -> Report:
    """Start `kind` (with `options`) and the servers it needs, run every check, stop everything."""
    if is_package_kind(kind):  # an environment from an installed package (entry point or module:attribute)
        family = package_family(kind)
    elif kind != "head" and kind not in available_kinds():
        raise ConfigError(f"unknown server kind {kind!r}: expected head or one of {', '.join(available_kinds())}")
    else:
        family = kind.split("/", 1)[0]
    report = Report(kind)
    with servers() as pool:
        try:
            if family == "resources":
                _check_resources(report, pool, kind, options)
            elif family == "agents":
                _check_agent(report, pool, kind, options)
            elif family == "models":
                _check_model(report, pool, kind, options)
            else:
                _check_head(report, pool, options)
        except (RuntimeError, TimeoutError, CheckFailed) as exc:  # a server that does not start: one failed check
            report.fail("start: the server and its helpers start and report ready", str(exc).splitlines()[0])
    return report


def _generic(report: Report, probe: Probe, family: str) -> dict[str, Any] | None:
    generic.check_probes(report, probe)
    generic.check_metrics(report, probe)
    spec = generic.fetch_openapi(report, probe, family)
    generic.check_auth(report, probe, generic.post_paths(spec)[:3])
    generic.check_bad_bodies(report, probe, spec)
    return spec


def _stub_and_agent(pool: Servers, resources: ServerProcess, row: dict[str, Any],
                    agent_kind: str = "agents/simple_agent", agent_options: Sequence[str] = ()
                    ) -> tuple[ServerProcess, ServerProcess]:
    """A stub model that answers the row's expected answer, and an agent wired to it and `resources`."""
    stub = pool.process("models/stub", spec={"text": answer_text(row)})
    extra = [f"user_model_url={stub.url}"] if agent_kind == "agents/multi_turn_agent" else []
    agent = pool.process(agent_kind, f"resources_url={resources.url}", f"model_url={stub.url}", *extra,
                         *agent_options)
    return stub, agent


def _check_rollout(report: Report, resources: Probe, agent: Probe, row: dict[str, Any]) -> dict[str, Any]:
    rollout: dict[str, Any] = {}
    with report.check("rollout: an agent's /run of an example row re-verifies to the same reward, "
                      "from the row and as the scored rollout itself"):
        r = agent.post("/run", row)
        expect(r.status_code == 200, f"POST /run: {r.status_code} {r.text[:200]}")
        rollout = r.json()
        expect(not rollout.get("mask_sample"), f"rollout masked: {rollout.get('failure_kind')}: "
                                               f"{rollout.get('failure_reason')}")
        expect(isinstance(rollout.get("response"), dict) and isinstance(rollout["response"].get("output"), list),
               "rollout has no response.output list")
        reward = check_verify_reply(rollout, {}, "POST /run")
        again = resources.post("/verify", verify_body(row, rollout["response"]))
        expect(again.status_code == 200, f"re-verify: {again.status_code} {again.text[:200]}")
        reward_again = check_verify_reply(again.json(), {}, "re-verify")
        expect(abs(reward - reward_again) < 1e-6, f"rollout reward {reward} but re-verify gives {reward_again}")
        # a collected rollout already carries reward and the verdict fields: verified again as it is
        scored = resources.post("/verify", {k: v for k, v in rollout.items() if k != "agent_ref"})
        expect(scored.status_code == 200, f"re-verify of the scored rollout: {scored.status_code} {scored.text[:200]}")
        reward_scored = check_verify_reply(scored.json(), {}, "re-verify of the scored rollout")
        expect(abs(reward - reward_scored) < 1e-6,
               f"rollout reward {reward} but the scored rollout re-verifies to {reward_scored}")
    return rollout


# --- resources -----------------------------------------------------------------------------------

def _check_resources(report: Report, pool: Servers, kind: str, options: list[str]) -> None:
    env_name = kind if is_package_kind(kind) else kind.split("/", 1)[1]
    source, rows = example_rows(env_name, ROW_LIMIT)
    with report.check("example rows: the environment ships example rows"):
        expect(rows, "none in " + " or ".join(str(p) for p in example_files(env_name)))
    helpers = []
    judge_reply = _scripted_judge_reply(kind, options)
    if judge_reply is not None:  # a judged environment with no judge given: a scripted one stands in
        judge = pool.process("models/stub", spec={"text": judge_reply})
        options = [f"judge_model_server={judge.url}", *options]
        helpers.append(judge)
    env = pool.process(kind, *options)
    stub, agent = _stub_and_agent(pool, env, rows[0] if rows else {})
    pool.start(*helpers, env, stub, agent)
    probe, agent_probe = Probe(env.url, pool.key), Probe(agent.url, pool.key)
    try:
        spec = _generic(report, probe, "resources")
        bindings.check_openenv(report, probe, rows[0] if rows else {})
        bindings.check_mcp(report, probe, [path for path, ops in ((spec or {}).get("paths") or {}).items()
                                           if "tools" in ((ops.get("post") or {}).get("tags") or [])],
                            rows[0] if rows else None)
        if rows:
            _check_rows(report, probe, rows, _shown(source))
            _check_sessions(report, probe, rows[0])
            _check_rollout(report, probe, agent_probe, rows[0])
    finally:
        probe.close()
        agent_probe.close()


def _scripted_judge_reply(kind: str, options: list[str]) -> str | None:
    """What a scripted judge answers for `kind` (its module's EXAMPLE_JUDGE_REPLY, or an equal verdict),
    or None when `kind` calls no judge or the options name one."""
    module = load_server(kind)
    if not issubclass(module.Config, JudgeConfig) or any(o.startswith("judge_model_server=") for o in options):
        return None
    return str(getattr(module, "EXAMPLE_JUDGE_REPLY", "My final verdict is [[A=B]]"))


def _shown(source: Any) -> str:
    """An example file's path, relative to the checkout when it is in it (a package's lies elsewhere)."""
    if source is None:
        return ""
    return str(source.relative_to(REPO)) if source.is_relative_to(REPO) else str(source)


def _check_rows(report: Report, probe: Probe, rows: list[dict[str, Any]], source: str) -> None:
    replies: list[dict[str, Any]] = []
    with report.check(f"verify: {len(rows)} example rows ({source}) get well-formed /verify replies, "
                      "and the reward a row's expected_reward names"):
        for i, row in enumerate(rows):
            body = verify_body(row, response_with_text(answer_text(row)))
            r = probe.post("/verify", body)
            expect(r.status_code == 200, f"row {i}: POST /verify {r.status_code} {r.text[:200]}")
            reward = check_verify_reply(r.json(), body, f"row {i}")
            want = row.get("expected_reward")
            if isinstance(want, (int, float)) and not isinstance(want, bool):
                expect(abs(reward - want) < 1e-6, f"row {i}: reward {reward} for the answer "
                                                  f"{answer_text(row)!r}, but the row's expected_reward is {want}")
            replies.append(r.json())
    with report.check("verify/batch: one well-formed reply per item, in order"):
        bodies = [verify_body(row, response_with_text(answer_text(row))) for row in rows[:2]]
        r = probe.post("/verify/batch", bodies)
        expect(r.status_code == 200, f"POST /verify/batch: {r.status_code} {r.text[:200]}")
        out = r.json()
        expect(isinstance(out, list) and len(out) == len(bodies), f"expected a list of {len(bodies)} replies")
        for i, (reply, body) in enumerate(zip(out, bodies)):
            check_verify_reply(reply, body, f"batch item {i}")
    with report.check("aggregate_metrics: verify replies aggregate to a JSON object"):
        r = probe.post("/aggregate_metrics", replies)
        expect(r.status_code == 200 and isinstance(r.json(), dict), f"POST /aggregate_metrics: {r.status_code}")


def _check_sessions(report: Report, probe: Probe, row: dict[str, Any]) -> None:
    with report.check("sessions: /seed_session opens one (X-Session-Id), /close_session closes it"):
        r = probe.post("/seed_session", {k: v for k, v in row.items() if k != "agent_ref"})
        expect(r.status_code == 200, f"POST /seed_session: {r.status_code} {r.text[:200]}")
        sid = r.json().get("session_id")
        expect(isinstance(sid, str) and sid, "seed_session reply has no session_id")
        expect(r.headers.get("x-session-id") == sid, "seed_session reply lacks the X-Session-Id header")
        r = probe.post("/close_session", {}, headers={"X-Session-Id": sid})
        expect(r.status_code == 200 and r.json().get("closed") is True, f"close_session: {r.status_code} {r.text[:200]}")
        r = probe.post("/close_session", {}, headers={"X-Session-Id": sid})
        expect(r.status_code < 500, f"closing a closed session: {r.status_code}")


# --- agents --------------------------------------------------------------------------------------

def _check_agent(report: Report, pool: Servers, kind: str, options: list[str]) -> None:
    _, rows = example_rows(AGENT_ENV, 1)
    expect(rows, f"the {AGENT_ENV} example rows are needed to check an agent")
    resources = pool.process(f"resources/{AGENT_ENV}")
    stub, agent = _stub_and_agent(pool, resources, rows[0], kind, options)
    pool.start(resources, stub, agent)
    probe, env_probe = Probe(agent.url, pool.key), Probe(resources.url, pool.key)
    try:
        _generic(report, probe, "agents")
        rollout = _check_rollout(report, env_probe, probe, rows[0])
        with report.check("v1/responses: a model call through the agent answers a Responses object"):
            r = probe.post("/v1/responses", rows[0]["responses_create_params"])
            expect(r.status_code == 200 and isinstance(r.json().get("output"), list),
                   f"POST /v1/responses: {r.status_code} {r.text[:200]}")
        with report.check("aggregate_metrics: rollouts aggregate to a JSON object"):
            r = probe.post("/aggregate_metrics", [rollout] if rollout else [])
            expect(r.status_code == 200 and isinstance(r.json(), dict), f"POST /aggregate_metrics: {r.status_code}")
    finally:
        probe.close()
        env_probe.close()


# --- models --------------------------------------------------------------------------------------

def _check_model(report: Report, pool: Servers, kind: str, options: list[str]) -> None:
    procs = []
    if kind == "models/openai_proxy" and not any(o.startswith(("base_url=", "base_urls=")) for o in options):
        # No upstream given: the stub stands in, reached in Responses pass-through mode. An upstream
        # never gets our key by itself: it is configured as the upstream's own key.
        upstream = pool.process("models/stub", "text=hello")
        procs.append(upstream)
        # The stub has no token data: the proxy is checked in evaluation mode (training mode would refuse it).
        options = [f"base_url={upstream.url}", "upstream_api=responses", "api_key=${GYMSERVE_API_KEY}",
                   "training_mode=false", *options]
    model = pool.process(kind, *options)
    pool.start(*procs, model)
    probe = Probe(model.url, pool.key)
    try:
        spec = _generic(report, probe, "models")
        with report.check("v1/models: lists at least one model"):
            r = probe.get("/v1/models")
            expect(r.status_code == 200, f"GET /v1/models: {r.status_code} {r.text[:200]}")
            data = r.json().get("data")
            expect(isinstance(data, list) and data and data[0].get("id"), "no data[0].id")
        out: dict[str, Any] = {}
        with report.check("v1/responses: a short call answers a Responses object with output items"):
            r = probe.post("/v1/responses", {"model": "check", "input": "Say hi.", "max_output_tokens": 4})
            expect(r.status_code == 200, f"POST /v1/responses: {r.status_code} {r.text[:200]}")
            out = r.json()
            expect(isinstance(out.get("output"), list) and out["output"], "no output items")
        if _training_mode(kind, options):
            with report.check("training mode: a call's last output item carries its token IDs and logprobs"):
                expect(bool(out.get("output")), "no reply to read token data from (see the call above)")
                _expect_token_data(out["output"][-1])
        if spec and "/v1/chat/completions" in spec.get("paths", {}) and "upstream_api=responses" not in options:
            with report.check("v1/chat/completions: a short call answers choices"):
                r = probe.post("/v1/chat/completions", {"model": "check", "max_tokens": 4,
                                                        "messages": [{"role": "user", "content": "Say hi."}]})
                expect(r.status_code == 200, f"POST /v1/chat/completions: {r.status_code} {r.text[:200]}")
                expect(isinstance(r.json().get("choices"), list) and r.json()["choices"], "no choices")
    finally:
        probe.close()


def _training_mode(kind: str, options: list[str]) -> bool:
    """Whether the server promises token data: an explicit `training_mode=` option, else its config's default
    (a server with no such option, such as the scripted stub, promises none)."""
    given = [o.split("=", 1)[1].lower() for o in options if o.startswith("training_mode=")]
    if given:
        return given[-1] not in ("false", "0", "no")
    field = load_server(kind).Config.model_fields.get("training_mode")
    return bool(field is not None and field.default)


def _expect_token_data(item: dict[str, Any]) -> None:
    """A trainer needs prompt_token_ids, generation_token_ids and one logprob per generated token."""
    prompt, generated = item.get("prompt_token_ids"), item.get("generation_token_ids")
    logprobs = item.get("generation_log_probs")
    expect(isinstance(prompt, list) and prompt and all(isinstance(i, int) for i in prompt),
           "no prompt_token_ids (a training-mode model server must return them; training_mode=false for evaluation)")
    expect(isinstance(generated, list) and all(isinstance(i, int) for i in generated), "no generation_token_ids")
    expect(isinstance(logprobs, list) and isinstance(generated, list) and len(logprobs) == len(generated)
           and all(isinstance(x, (int, float)) and x <= 0 for x in logprobs),
           "generation_log_probs missing, not one per generated token, or not log-probabilities")


# --- head ----------------------------------------------------------------------------------------

def _check_head(report: Report, pool: Servers, options: list[str]) -> None:
    head = pool.process("head", *options)
    pool.start(head)
    probe = Probe(head.url, pool.key)
    try:
        _generic(report, probe, "head")
        with report.check("server_instances: a JSON list"):
            r = probe.get("/server_instances")
            expect(r.status_code == 200 and isinstance(r.json(), list), f"GET /server_instances: {r.status_code}")
        with report.check("global_config_dict_yaml: a YAML string of the resolved config"):
            r = probe.get("/global_config_dict_yaml")
            expect(r.status_code == 200, f"GET /global_config_dict_yaml: {r.status_code}")
            text = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
            expect(isinstance(text, str) and isinstance(yaml.safe_load(text), dict), "not a YAML mapping")
    finally:
        probe.close()
