"""The differential for NeMo-Gym's resources servers hosted by gymserve (`kind: nemo_gym/<server>`).

For one server of the wheel, its own `data/example.jsonl` rows are played by a scripted policy: a
`models/stub` that answers each row with the final message of NeMo-Gym's recorded rollout of that row
(`data/example_rollouts.jsonl`), carried in the row as `responses_create_params.metadata.stub_script`.
The same rows run twice against the same NeMo-Gym server process:

- through gymserve: `gymserve collect --agent <our simple_agent>`, via our head, our key and the sidecar;
- as NeMo-Gym runs them: NeMo-Gym's own `simple_agent` (its `app.py` from the wheel, in its virtualenv)
  posting straight to the server's loopback address, one `/run` per row as its collector posts them.

Shared by the tests and by the whole-catalogue run (`tests/compat/catalogue_run.py`).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from gymserve.nemo_gym.wheel import ServerFiles
from services.core.ports import free_port

NO_RECORDING = "(no recorded response)"


def final_text(response: dict[str, Any]) -> tuple[str, bool]:
    """(the last assistant message's text, whether the recorded rollout called tools)."""
    texts, calls = [], False
    for item in response.get("output") or []:
        if item.get("type") == "function_call":
            calls = True
        if item.get("type") == "message" and item.get("role", "assistant") == "assistant":
            parts = item.get("content") or []
            texts.append("".join(p.get("text", "") for p in parts if isinstance(p, dict)))
    return (texts[-1] if texts else ""), calls


def _key(row: dict[str, Any]) -> str:
    return json.dumps((row.get("responses_create_params") or {}).get("input"), sort_keys=True)


def replay_rows(files: ServerFiles) -> tuple[list[dict[str, Any]], str | None]:
    """The example rows, each carrying its recorded response as the stub's script; or a reason they cannot
    be replayed by a one-step script."""
    rows, rollouts = files.example_rows(), files.example_rollouts()
    if not rows:
        return [], "no data/example.jsonl rows"
    recorded = {_key(r): r for r in rollouts if isinstance(r.get("response"), dict)}
    out = []
    for i, row in enumerate(rows):
        rec = recorded.get(_key(row)) or (rollouts[i] if len(rollouts) == len(rows) else None)
        text, calls = final_text(rec["response"]) if rec else (NO_RECORDING, False)
        if calls:
            return [], "its recorded rollouts call tools (a multi-step replay, not a one-step scripted policy)"
        row = copy.deepcopy(row)
        row.pop("agent_ref", None)
        # a null parameter is the parameter left out (OpenAI's meaning); our stub refuses a null boolean
        params = {k: v for k, v in (row.get("responses_create_params") or {}).items() if v is not None}
        row["responses_create_params"] = params
        metadata = params.get("metadata") if isinstance(params.get("metadata"), dict) else {}
        params["metadata"] = {**metadata, "stub_script": json.dumps([{"text": text}])}
        out.append(row)
    return out, None


def stack_yaml(servers: list[str]) -> str:
    """A stack with each server hosted, our simple_agent for it, and the replaying stub."""
    lines = ["head: {host: 127.0.0.1, port: 0}", "servers:", "  replay: {kind: models/stub, text: \"" + NO_RECORDING
             + "\"}"]
    for s in servers:
        lines.append(f"  nemo_{s}: {{kind: nemo_gym/{s}}}")
        lines.append(f"  nemo_{s}_agent: {{kind: agents/simple_agent, resources_server: nemo_{s}, model_server: replay}}")
    return "\n".join(lines) + "\n"


def collect_through_gymserve(head: str, agent: str, rows: list[dict[str, Any]], workdir: Path,
                             env: dict[str, str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`gymserve collect --agent` on the rows: (rollouts in row order, failures)."""
    rows_file, out = workdir / f"{agent}.rows.jsonl", workdir / f"{agent}.rollouts.jsonl"
    rows_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = subprocess.run([sys.executable, "-m", "gymserve", "collect", "-i", str(rows_file), "-o", str(out),
                           "--head", head, "--agent", agent, "--no-progress", "--concurrency", "4"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode in (0, 1), (done.stdout + done.stderr)[-4000:]
    rollouts = [json.loads(line) for line in out.read_text().splitlines()] if out.exists() else []
    failures_file = out.with_name(out.name.replace(".jsonl", "_failures.jsonl"))
    failures = [json.loads(line) for line in failures_file.read_text().splitlines()] if failures_file.exists() else []
    rollouts.sort(key=lambda r: r.get("_ng_task_index", r.get("task_index", 0)))
    return rollouts, failures


@dataclass
class NeMoSide:
    """NeMo-Gym's own simple_agent (and a stub it can reach without a key) against a raw server URL."""

    venv: Path
    workdir: Path
    procs: list[subprocess.Popen] = field(default_factory=list)

    def _wait(self, url: str, proc: subprocess.Popen, log: Path, path: str = "/health") -> None:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(log.read_text()[-4000:])
            try:
                if httpx.get(url + path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise TimeoutError(log.read_text()[-4000:])

    def start_stub(self) -> str:
        port = free_port()
        log = self.workdir / "nemo_side_stub.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("GYMSERVE_")}
        env["GYMSERVE_NO_AUTH"] = "1"
        with open(log, "w") as out:
            proc = subprocess.Popen([sys.executable, "-m", "gymserve", "serve", "models/stub", "--port", str(port),
                                     "--name", "replay", f"text={NO_RECORDING}"], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        self._wait(url, proc, log, "/ready")
        self.stub = (port, url)
        return url

    def start_agent(self, instance: str, impl: str, raw_url: str) -> str:
        """NeMo-Gym's simple_agent with `instance` (the server's own name) at `raw_url`."""
        host, port = raw_url.removeprefix("http://").rsplit(":", 1)
        agent_port = free_port()
        config = {
            instance: {"resources_servers": {impl: {"entrypoint": "app.py", "host": host, "port": int(port)}}},
            "replay": {"responses_api_models": {"stub": {"entrypoint": "app.py", "host": "127.0.0.1",
                                                         "port": self.stub[0]}}},
            "nemo_agent": {"responses_api_agents": {"simple_agent": {
                "entrypoint": "app.py", "host": "127.0.0.1", "port": agent_port,
                "resources_server": {"type": "resources_servers", "name": instance},
                "model_server": {"type": "responses_api_models", "name": "replay"}}}},
            "head_server": {"host": "127.0.0.1", "port": free_port()}, "dry_run": False,
        }
        [app] = list(self.venv.glob("lib/python3.*/site-packages/responses_api_agents/simple_agent/app.py"))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GYMSERVE_", "VIRTUAL_ENV"))}
        env.update(PYTHONUNBUFFERED="1", NEMO_GYM_CONFIG_DICT=yaml.safe_dump(config), NEMO_GYM_CONFIG_PATH="nemo_agent",
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_AUTH_MODE="disabled")
        log = self.workdir / f"nemo_agent_{instance}.log"
        with open(log, "w") as out:
            proc = subprocess.Popen([str(self.venv / "bin" / "python"), str(app)], cwd=app.parent, env=env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{agent_port}"
        self._wait(url, proc, log)
        return url

    def run_rows(self, agent_url: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One `/run` per row, as NeMo-Gym's collector posts them: each reply's JSON (or its error)."""
        out = []
        for row in rows:
            reply = httpx.post(f"{agent_url}/run", json=row, timeout=600)
            out.append(reply.json() if reply.status_code == 200 else {"error": reply.status_code,
                                                                       "text": reply.text[-1000:]})
        return out

    def stop_agent(self, proc_index: int = -1) -> None:
        self._stop(self.procs.pop(proc_index))

    def close(self) -> None:
        while self.procs:
            self._stop(self.procs.pop())

    @staticmethod
    def _stop(proc: subprocess.Popen) -> None:
        import signal

        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
