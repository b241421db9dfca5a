"""`gymserve check` fails a model server in training mode that returns no token data, and passes the same
server in evaluation mode (the scripted stub behind models/openai_proxy, which returns text only)."""
from __future__ import annotations

from gymserve.conformance import run_check

TOKEN_CHECK = "training mode: a call's last output item carries its token IDs and logprobs"


def test_training_mode_without_token_data_fails_the_check() -> None:
    # the proxy's default upstream in a check is the stub; training_mode=true overrides the check's default
    report = run_check("models/openai_proxy", ["training_mode=true"])
    assert not report.ok
    failed = [o for o in report.outcomes if not o.ok]
    assert any("v1/responses" in o.name or o.name == TOKEN_CHECK for o in failed), report.render()


def test_evaluation_mode_passes() -> None:
    report = run_check("models/openai_proxy", [])
    assert report.ok, report.render()


def test_responses_mode_in_training_refuses_replies_without_token_ids() -> None:
    """An upstream Responses API without our token fields (vLLM's own /v1/responses) cannot feed training:
    the proxy answers 502 naming the fix instead of a rollout that would be masked later."""
    from gymserve.testing import ServerProcess

    with ServerProcess("models/stub", "text=hi", name="stub_tokens") as stub, \
            ServerProcess("models/openai_proxy", f"base_url={stub.url}", "upstream_api=responses",
                          name="proxy_tokens") as proxy:
        reply = proxy.post("/v1/responses", {"model": "m", "input": "Say hi."})
        assert reply.status_code == 502, reply.text
        assert "upstream_api=completions" in reply.text and "training_mode=false" in reply.text
        with ServerProcess("models/openai_proxy", f"base_url={stub.url}", "upstream_api=responses",
                           "training_mode=false", name="proxy_eval") as evaluation:
            assert evaluation.post("/v1/responses", {"model": "m", "input": "Say hi."}).status_code == 200
