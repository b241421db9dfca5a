"""The head's dashboard in a real headless Chromium while rollouts flow through a real stack
(head, exact_match, the scripted `models/stub` policy standing in for a model, simple_agent):
charts are drawn, its numbers are the head's `/health/servers` numbers, training records
posted by the trainer's feed show up, and a screenshot is saved under test-output/. After a
run of a few seconds every chart has data and no two axis labels overlap, on the dashboard
and in `gymserve collect`'s report."""
from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

from gymserve.testing import ServerProcess, hung_server
from tests.integration._trainer_stack import wait_registered
from tests.integration.browser import Chromium, DomIndex, chromium_binary
from trainer.client import RolloutClient
from trainer.collect import collect, sibling
from trainer.training_feed import TrainingFeed

pytestmark = pytest.mark.slow

AGENT = "em_agent"
SCREENSHOT_DIR = Path(__file__).resolve().parents[2] / "test-output" / "dashboard"


def _row(answer: str, script: list | None = None) -> dict:
    params: dict = {"input": [{"role": "user", "content": "Capital?"}]}
    if script is not None:
        params["metadata"] = {"stub_script": json.dumps(script)}
    return {"responses_create_params": params, "expected_answer": answer,
            "agent_ref": {"type": "responses_api_agents", "name": AGENT}}


@pytest.fixture(scope="module")
def stack():
    yield from _stack("health_interval_s=0.5")


@pytest.fixture()
def default_sampling_stack():
    yield from _stack()  # the head samples its servers every 5 s, as `gymserve up` runs it


def _stack(*head_options: str):
    head = ServerProcess("head", *head_options, "probe_timeout_s=30", name="head").start()
    procs: list[ServerProcess] = []
    try:
        env = {"GYMSERVE_HEAD_URL": head.url}
        for kind, name, opts in [("resources/exact_match", "exact_match", []),
                                 ("models/stub", "policy", ["text=Paris"]),
                                 ("agents/simple_agent", AGENT, ["resources_server=exact_match",
                                                                 "model_server=policy", "rollout_deadline_s=30"])]:
            procs.append(ServerProcess(kind, *opts, name=name, env=env).start())
        wait_registered(head.url, ["exact_match", "policy", AGENT])
        yield head
    finally:
        for proc in reversed(procs):
            proc.stop()
        head.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Chromium(chromium_binary(), tmp_path_factory.mktemp("chromium"))
    yield chromium
    chromium.close()


def _collect(head_url: str, rows: list[dict], out: Path) -> None:
    async def go() -> None:
        async with RolloutClient(head_url, concurrency=3, retries=0) as client:
            await collect(rows, out, client=client)
    asyncio.run(go())


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _values(dom: DomIndex, container: str, key_attr: str) -> dict[str, dict[str, str]]:
    """{row key: {data-field: data-value}} for the rows/cards inside element #container."""
    out: dict[str, dict[str, str]] = {}
    for el in dom.within(dom.by_id(container), data_field="*"):
        owner = el.closest(key_attr)
        if owner is not None and "data-value" in el.attrs:
            out.setdefault(owner.attrs[key_attr], {})[el.attrs["data-field"]] = el.attrs["data-value"]
    return out


def _same(shown: str, value: float | None) -> bool:
    return (value is None and shown == "") or (value is not None and shown != "" and float(shown) == value)


def test_dashboard_in_chromium(stack, browser, tmp_path):
    head = stack
    # 24 rollouts rewarded 1, 12 rewarded 0, 4 whose model call fails (masked as upstream), spread over seconds
    rows = ([_row("Paris", [{"sleep": 0.15, "text": "Paris"}]) for _ in range(24)]
            + [_row("Madrid", [{"sleep": 0.15, "text": "Paris"}]) for _ in range(12)]
            + [_row("Paris", [{"status": 500, "error": "model fell over"}]) for _ in range(4)])
    rows = [rows[i] for i in sorted(range(len(rows)), key=lambda i: (i * 7) % len(rows))]
    out = tmp_path / "rollouts.jsonl"
    sender = threading.Thread(target=_collect, args=(head.url, rows, out))
    sender.start()
    try:
        live = DomIndex(browser.dump_dom(f"{head.url}/dashboard", budget_ms=3000))
    finally:
        sender.join(120)
    results = _lines(out) + _lines(sibling(out, "_failures.jsonl"))
    assert not sender.is_alive() and len(results) == len(rows)
    assert live.by_id("environments") and live.find("tr", data_server="exact_match")
    assert live.find("body", data_state="ok"), "the page's first data fetch failed"

    judged = [r for r in results if not r.get("mask_sample")]
    masked = [r for r in results if r.get("mask_sample")]
    assert len(judged) == 36 and sum(r["reward"] for r in judged) == 24
    assert len(masked) == 4 and {r["failure_kind"] for r in masked} == {"upstream"}
    report_page = DomIndex(sibling(out, "_report.html").read_text())  # `gymserve collect`'s offline report
    card = report_page.find("div", data_env=AGENT)[0]
    assert [el.text for el in report_page.within(card, data_field="*")] == ["36", "0.6667", "4"]
    assert "upstream" in card.text and len(report_page.within(card, "rect")) >= 2

    feed = TrainingFeed(head.url, run="browser-test")
    for step in range(1, 21):
        feed.post({"step": step, "reward": 0.2 + 0.03 * step, "kl": 0.001 * step, "loss": 0.5 / step,
                   "rewards/exact_match/mean": 0.2 + 0.03 * step})
    assert feed.flush(30) and feed.sent == 20 and feed.dropped == 0

    report = head.get("/health/servers").json()  # a fresh sample: what the page must show now
    rows_by_name = {r["name"]: r for r in report["servers"]}
    em = rows_by_name["exact_match"]
    assert em["rewards_total"] == 36 and em["reward_mean"] == pytest.approx(24 / 36, abs=1e-6)
    assert rows_by_name[AGENT]["failures_by_kind"] == {"upstream": 4}

    url = f"{head.url}/dashboard"
    dom = DomIndex(browser.dump_dom(url, budget_ms=3000))
    assert dom.find("body", data_state="ok")
    # charts: per environment a histogram and a mean-reward line, two traffic charts, three training charts
    env_card = dom.find("div", data_env="exact_match")[0]
    assert len(dom.within(env_card, "canvas")) == 2
    assert len(dom.within(dom.by_id("traffic"), "canvas")) == 2
    training = dom.by_id("training")
    assert "hidden" not in training.attrs and "browser-test" in training.text
    assert len(dom.within(training, "canvas")) == 3
    assert "step" in training.text and "kl" in training.text
    bins = head.get("/dashboard/data").json()["environments"][0]["histogram"]  # what the histogram draws
    assert {(b["lo"], b["hi"]): b["count"] for b in bins if b["count"]} == {(-0.25, 0.0): 12, (0.9, 1.0): 24}

    servers = _values(dom, "servers", "data-server")
    for name, row in rows_by_name.items():
        for field in ("requests_total", "failures_total", "health"):
            shown = servers[name][field]
            assert shown == row[field] if field == "health" else _same(shown, row[field]), (name, field, shown)
    env = _values(dom, "environments", "data-env")["exact_match"]
    assert _same(env["rewards_total"], em["rewards_total"]) and _same(env["reward_mean"], em["reward_mean"])
    assert _same(env["masked_total"], em["failures_total"])
    failures = _values(dom, "failures", "data-server")
    assert _same(failures[AGENT]["failures.upstream"], 4) and _same(failures[AGENT]["failures.timeout"], 0)

    shot = browser.screenshot(url, SCREENSHOT_DIR / "dashboard.png", budget_ms=3000)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def _overlaps(labels: list[list]) -> list[tuple[str, str]]:
    """Pairs of neighbouring labels ([text, left px, right px, line]) on one line whose boxes touch or overlap."""
    out = []
    for line in {label[3] if len(label) > 3 else 0 for label in labels}:
        spans = sorted((lb[1], lb[2], lb[0]) for lb in labels if (lb[3] if len(lb) > 3 else 0) == line)
        out += [(a[2], b[2]) for a, b in zip(spans, spans[1:]) if b[0] < a[1] + 2]
    return out


def test_charts_have_data_and_labels_apart_after_a_short_run(stack, browser, tmp_path):
    """A run of a few seconds, rewards 0 and 1: the mean-reward and traffic charts show it at once,
    the histogram's bin for rewards of 0 reads "≤0", and no two x labels overlap (each chart's
    container records the labels it drew with their pixel extents)."""
    head = stack
    rows = [_row("Paris" if i % 3 else "Rome", [{"sleep": 0.05, "text": "Paris"}]) for i in range(30)]
    out = tmp_path / "short.jsonl"
    _collect(head.url, rows, out)
    head.get("/health/servers")  # a sample after the run, as the head's timer takes every few seconds
    url = f"{head.url}/dashboard"
    dom = DomIndex(browser.dump_dom(url, budget_ms=3000))
    card = dom.find("div", data_env="exact_match")[0]
    charts = {el.attrs["data-chart"]: el for el in dom.find("div", data_chart="*")}
    for key in ("reward-histogram", "rates", "latency"):
        assert int(charts[key].attrs.get("data-points", "0")) > 0, (key, charts[key].attrs)
    mean = dom.within(card, "div", data_chart="reward-mean")[0]
    assert int(mean.attrs.get("data-points", "0")) > 0, mean.attrs
    hist = dom.within(card, "div", data_chart="reward-histogram")[0]
    hist_labels = json.loads(hist.attrs["data-x-labels"])
    assert hist_labels[0][0] == "≤0" and not any(label[0].startswith("-0.25") for label in hist_labels)
    for key, el in [("histogram", hist), ("mean", mean), ("rates", charts["rates"]), ("latency", charts["latency"])]:
        labels = json.loads(el.attrs["data-x-labels"])
        assert labels and not _overlaps(labels), (key, labels)
    shot = browser.screenshot(url, SCREENSHOT_DIR / "dashboard_short_run.png", budget_ms=3000)
    assert shot.stat().st_size > 20_000

    # the collect report: its SVG labels measured by the browser that renders them
    report = sibling(out, "_report.html").read_text()
    probe = tmp_path / "report_probe.html"
    probe.write_text(report.replace("</body>", MEASURE_SVG_LABELS + "</body>"))
    measured = DomIndex(browser.dump_dom(probe.as_uri(), budget_ms=1000))
    boxes = json.loads(measured.find("body")[0].attrs["data-x-labels"])
    assert boxes and "≤0" in [label[0] for chart in boxes for label in chart]
    for chart in boxes:
        assert not _overlaps(chart), chart
    browser.screenshot(probe.as_uri(), SCREENSHOT_DIR / "collect_report.png", budget_ms=1000)


def test_a_short_run_shows_on_every_chart_at_the_default_sampling(default_sampling_stack, browser, tmp_path):
    """At the default 5 s sampling and no forced probe: a run of a few seconds is on the mean-reward,
    histogram and traffic charts once the head's timer has sampled after it, as a user opening the
    dashboard after `gymserve collect` sees it."""
    head = default_sampling_stack
    assert head.get("/dashboard/data").json()["refresh_s"] == 5.0
    rows = [_row("Paris" if i % 3 else "Rome", [{"sleep": 0.3, "text": "Paris"}]) for i in range(30)]
    _collect(head.url, rows, tmp_path / "short.jsonl")  # about 3 s at concurrency 3
    ended = time.time()
    deadline = time.monotonic() + 30
    while head.get("/dashboard/data").json()["generated_at"] <= ended:  # the timer's next round, not ours
        assert time.monotonic() < deadline, "the head never sampled after the run"
        time.sleep(0.5)
    dom = DomIndex(browser.dump_dom(f"{head.url}/dashboard", budget_ms=3000))
    card = dom.find("div", data_env="exact_match")[0]
    charts = {el.attrs["data-chart"]: el for el in dom.find("div", data_chart="*")}
    for key in ("rates", "latency"):
        assert int(charts[key].attrs.get("data-points", "0")) > 0, (key, charts[key].attrs)
    for key in ("reward-mean", "reward-histogram"):
        chart = dom.within(card, "div", data_chart=key)[0]
        assert int(chart.attrs.get("data-points", "0")) > 0, (key, chart.attrs)
    browser.screenshot(f"{head.url}/dashboard", SCREENSHOT_DIR / "dashboard_default_sampling.png", budget_ms=3000)


# In the browser: each SVG chart's x tick labels (the text under the plot) with their rendered extents.
MEASURE_SVG_LABELS = """<script>
document.body.setAttribute("data-x-labels", JSON.stringify(Array.prototype.map.call(
  document.querySelectorAll("svg.chart"), function (svg) {
    var ticks = Array.prototype.filter.call(svg.querySelectorAll("text.tick"), function (t) {
      return t.getAttribute("text-anchor") === "middle" && t.textContent !== "step"; });
    return ticks.map(function (t) { var b = t.getBoundingClientRect(); return [t.textContent, b.left, b.right]; });
  })));
</script>"""


def test_static_files_are_cached_and_bounded(stack):
    head = stack
    r = head.get("/dashboard/static/uPlot.iife.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert "max-age" in r.headers["cache-control"] and "uPlot" in r.text[:200]
    assert head.get("/dashboard/static/uPlot.LICENSE").text.startswith("The MIT License")
    assert head.get("/dashboard/static/..%2Fapp.py").status_code == 404
    assert head.get("/dashboard/static/nope.js").status_code == 404
    assets = re.findall(r'<(?:script|link)[^>]*(?:src|href)="([^"]*)"', head.get("/dashboard").text)
    assert len(assets) == 4 and all(a.startswith("/dashboard/static/") for a in assets)  # nothing from elsewhere


def test_training_metrics_validation(stack):
    head = stack
    r = head.post("/training/metrics", json={"reward": 1.0})
    assert r.status_code == 422 and "step" in r.json()["detail"]
    r = head.post("/training/metrics", json={"step": 1, "kl": "lots"})
    assert r.status_code == 422 and "kl" in r.json()["detail"]
    r = head.post("/training/metrics", json={"step": 1, "rewards": 1})
    assert r.status_code == 422 and "rewards" in r.json()["detail"]
    r = head.post("/training/metrics", json=[{"step": 1}, {"step": -1}])
    assert r.status_code == 422 and "item 1" in r.json()["detail"] and "step" in r.json()["detail"]
    r = head.post("/training/metrics", json=[{"step": 1}] * 1001)
    assert r.status_code == 400 and "at most 1000" in r.json()["detail"]
    r = head.post("/training/metrics", content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400
    r = head.post("/training/metrics", json={"run": "v", "step": 2, "reward": 0.5, "reward_components": {"a": 0.5}})
    assert r.status_code == 200
    got = head.get("/training/metrics", params={"run": "v"}).json()
    assert [(x["step"], x["reward"], x["reward_components"]) for x in got["records"]] == [(2, 0.5, {"a": 0.5})]
    assert head.get("/training/metrics", params={"run": "nope"}).status_code == 404


def test_hung_server_does_not_stall_the_dashboard(stack):
    """A registered server that accepts connections and never answers: while the head's probe
    of it hangs (30 s probe timeout here), the page and its data answer from the last samples.
    Last in this module: the head's /health/servers waits for that probe round."""
    head = stack
    with hung_server() as (port, held):
        assert head.post("/register", json={"name": "hung", "host": "127.0.0.1", "port": port,
                                            "ttl_s": 120}).status_code == 200
        deadline = time.monotonic() + 60
        while not held:  # wait until the head's timer probe has connected (it then waits for an answer)
            assert time.monotonic() < deadline, "the head never probed the registered server"
            time.sleep(0.05)
        with httpx.Client(timeout=10) as client:
            for _ in range(3):
                data = client.get(f"{head.url}/dashboard/data").json()
                assert client.get(f"{head.url}/dashboard").status_code == 200
        assert {"servers", "environments", "timeline", "training"} <= set(data)
