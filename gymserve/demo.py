"""`make demo` (`python -m gymserve.demo`): every environment end to end, next to its reference answers.

Starts `gymserve up` with the default stack plus `gymserve/stacks/demo.yaml` (the judged and
sandboxed environments, a scripted rule judge and a scripted reference policy), its logs going to
a file. For every bundled example dataset it collects the embedded policy's rollout of its first
row (`--rows`) and every row's reference answer through the same agent -> environment -> verify
path, prints one table, writes `summary.json` next to the rollouts, and stops the stack with
SIGINT. Options:
`--rows`, `--max-output-tokens`, `--repeats`, `--out`, `--head` (use a running stack), and
`-- key=value ...` stack overrides passed to `gymserve up`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

import httpx
import yaml

from gymserve import demo_reference

REPO = Path(__file__).resolve().parent.parent
STACKS = Path(__file__).resolve().parent / "stacks"
STARTING = re.compile(r"starting (\d+) servers")
READY = re.compile(r"all (\d+) servers ready")
SANDBOXED = ("terminal", "swe")  # environments that need bubblewrap in the demo stack
# Progress bars and advisories of Hugging Face libraries: the servers' log file needs none of them.
QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "HF_HUB_VERBOSITY": "error",
             "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1", "TOKENIZERS_PARALLELISM": "false"}


def example_datasets(root: Path = REPO / "datasets") -> list[Path]:
    return sorted(root.glob("*/example.jsonl"))


def sandbox_problem() -> str | None:
    """Why bubblewrap sandboxes cannot run here, or None when they can (a real `bwrap` run)."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    if shutil.which("git") is None:
        return "git is not installed (apt-get install git python3-pytest)"
    try:
        run = subprocess.run([bwrap, "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True,
                             text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap does not run: {exc}"
    return None if run.returncode == 0 else f"bubblewrap does not run here: {run.stderr.strip()[:120]}"


def policy_dtype_override(overrides: list[str], cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """bfloat16 for the demo's policy where the CPU multiplies it in hardware (AMX): the tool
    environments' long prompts then prefill several times faster. Elsewhere, and when the user
    chose a dtype, nothing changes (emulated bfloat16 is slower than float32)."""
    if any(o.startswith("servers.policy_model.dtype=") for o in overrides):
        return []
    try:
        flags = cpuinfo.read_text()
    except OSError:
        return []
    return ["servers.policy_model.dtype=bfloat16"] if re.search(r"\bamx_bf16\b", flags) else []


def demo_overlay(out_dir: Path, leave_out: list[str]) -> Path:
    """The demo stack file, or a copy in `out_dir` without the servers of `leave_out` environments."""
    path = STACKS / "demo.yaml"
    if not leave_out:
        return path
    stack = yaml.safe_load(path.read_text())
    for name in list(stack["servers"]):
        if any(name == env or name.startswith(f"{env}_") for env in leave_out):
            del stack["servers"][name]
    copy = out_dir / "demo_stack.yaml"
    copy.write_text(yaml.safe_dump(stack, sort_keys=False))
    return copy


class Stack:
    """`gymserve up` as a child process whose output goes to a log file."""

    def __init__(self, files: list[Path], overrides: list[str], log: Path) -> None:
        from services.core.ports import free_port

        self.port = free_port()
        self.head_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log
        cmd = [sys.executable, "-m", "gymserve", "up", *(a for f in files for a in ("-c", str(f))),
               f"head.port={self.port}", *overrides]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **QUIET_ENV}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                     cwd=REPO, start_new_session=True)
        self.total: int | None = None
        self.ready = threading.Event()
        self.lines: list[str] = []
        self._log: IO[str] = log.open("w")
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._log.write(line)
            self._log.flush()
            line = line.rstrip("\n")
            self.lines.append(line)
            if (m := STARTING.search(line)) and self.total is None:
                self.total = int(m.group(1))
            if READY.search(line):
                self.ready.set()

    def registered(self, http: httpx.Client) -> int:
        try:
            reply = http.get(f"{self.head_url}/server_instances", timeout=2)
            return len(reply.json()) + 1 if reply.status_code == 200 else 0  # + the head itself
        except (httpx.HTTPError, ValueError):
            return 0

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                return self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                return self.proc.wait(10)
        return self.proc.returncode


def wait_ready(stack: Stack, timeout_s: float, progress: Any) -> bool:
    """Start-up progress bar: servers registered with the head, out of those `gymserve up` starts."""
    from services.core.auth import adopt_default_key, auth_headers

    task = progress.add_task("starting servers", total=None)
    deadline = time.monotonic() + timeout_s
    with httpx.Client(trust_env=False) as http:
        while time.monotonic() < deadline:
            if stack.ready.wait(0.5):
                progress.update(task, total=stack.total, completed=stack.total)
                return True
            if stack.proc.poll() is not None:
                return False
            if stack.total is not None:
                if "authorization" not in http.headers:  # the key `gymserve up` writes at its start
                    adopt_default_key()
                    http.headers.update(auth_headers())
                progress.update(task, total=stack.total, completed=min(stack.registered(http), stack.total - 1))
    return False


def _limit_rows(rows: list[dict[str, Any]], count: int, max_output_tokens: int) -> list[dict[str, Any]]:
    out = []
    for row in rows[:count]:
        row = json.loads(json.dumps(row))
        params = row.setdefault("responses_create_params", {})
        params["max_output_tokens"] = min(int(params.get("max_output_tokens") or max_output_tokens), max_output_tokens)
        out.append(row)
    return out


def judge_names(stack_files: list[Path]) -> dict[str, str]:
    """Environment -> the judge model server its stack entry names (judged environments only)."""
    from services.core.config import load_stack

    judges = {}
    for name, server in load_stack([str(f) for f in stack_files]).servers.items():
        ref = server.options.get("judge_model_server")
        if ref:
            judges[name] = ref.get("name") if isinstance(ref, dict) else str(ref)
    return judges


# What each judge of the demo stack decides (its rules are in gymserve/stacks/demo.yaml).
JUDGE_LABELS = {("rule_judge", "genrm_compare"): "rule judge (scripted): identical answers tie, else the first shown",
                ("rule_judge", None): "rule judge (scripted): does the response contain the reference?",
                ("policy_model", None): "the policy (SmolLM2-135M)"}


def judge_label(judge: str, env: str) -> str:
    return JUDGE_LABELS.get((judge, env)) or JUDGE_LABELS.get((judge, None)) or judge


async def run_demo(head_url: str, *, rows_per_env: int, max_output_tokens: int, repeats: int, out_dir: Path,
                   datasets: list[Path], left_out: dict[str, str], judges: dict[str, str], progress: Any,
                   concurrency: int = 6, rollout_deadline_s: float = 300,
                   reference_rows: int | None = None) -> list[dict[str, Any]]:
    """Collect the policy's rollouts of the first `rows_per_env` rows of every dataset and the references of
    its first `reference_rows` (default: all; they cost the policy nothing); one summary entry per dataset."""
    from services.core.auth import adopt_default_key, auth_headers
    from trainer.client import RolloutClient, agent_name, route_to
    from trainer.collect import collect
    from trainer.jsonl import read_rows

    adopt_default_key()  # the key the stack's `gymserve up` generated
    async with httpx.AsyncClient(trust_env=False, headers=auth_headers()) as http:
        names = {r["name"] for r in (await http.get(f"{head_url}/server_instances", timeout=30)).json()}
    # a few rollouts in flight across all environments: the CPU model batches them, while many long
    # prompts at once would make every call wait for the slowest prefill
    client = RolloutClient(head_url, concurrency=concurrency, deadline_s=rollout_deadline_s, retries=1)
    # the scripted references cost the policy nothing: their own slots, so they never wait behind it
    reference_client = RolloutClient(head_url, concurrency=8, deadline_s=rollout_deadline_s, retries=1)
    results: dict[str, dict[str, Any]] = {}
    jobs: list[tuple[str, str, list[dict[str, Any]]]] = []  # (env, "policy" | "reference", rows)
    for path in datasets:
        env = path.parent.name
        entry: dict[str, Any] = {"environment": env, "rollouts": 0, "scored": 0, "masked": 0, "mean_reward": None,
                                 "reference_reward": None, "reference_max": demo_reference.spec(env).maximum}
        if env in judges:
            entry["judge"] = judge_label(judges[env], env)
        results[env] = entry
        if env in left_out:
            entry["reason"] = left_out[env]
            continue
        rows = _limit_rows(read_rows(path), rows_per_env, max_output_tokens)
        if any(agent_name(r) is None for r in rows):  # NeMo-Gym rows name no agent: the environment's own
            rows, _ = route_to(rows, f"{env}_simple_agent")
        missing = sorted({agent_name(r) or "?" for r in rows} - names)
        if missing:
            entry["reason"] = f"agent {', '.join(missing)} not in the stack"
            continue
        jobs.append((env, "policy", rows))
        all_rows = _limit_rows(read_rows(path), reference_rows or 10**9, max_output_tokens)
        if any(agent_name(r) is None for r in all_rows):
            all_rows, _ = route_to(all_rows, f"{env}_simple_agent")
        reference = demo_reference.reference_rows(path, all_rows)
        note = demo_reference.spec(env).note
        if note:
            entry["reference_note"] = note
        if reference is None or f"{env}_reference_agent" not in names:
            entry["reference_max"] = None
            entry["reference_note"] = (f"no reference answers (datasets/{env}/reference.jsonl and "
                                       f"{env}_reference_agent in gymserve/stacks/demo.yaml)")
        else:
            jobs.append((env, "reference", reference))

    total = sum(len(rows) * (repeats if kind == "policy" else 1) for _, kind, rows in jobs)
    task = progress.add_task("collecting rollouts", total=total)

    def tick(record: dict[str, Any], stats: Any) -> None:
        progress.advance(task)

    async def one(env: str, kind: str, rows: list[dict[str, Any]]) -> None:
        where = out_dir if kind == "policy" else out_dir / "reference"
        await collect(rows, where / f"{env}.jsonl", client=client if kind == "policy" else reference_client,
                      repeats=repeats if kind == "policy" else 1, on_record=tick)
        overall = json.loads((where / f"{env}_metrics.json").read_text())["overall"]
        entry = results[env]
        if kind == "reference":
            entry["reference_reward"] = overall.get("mean_reward")
            entry["reference_rollouts"] = overall.get("num_scored", 0) + overall.get("num_masked", 0)
            entry["reference_masked"] = overall.get("num_masked", 0)
            if entry["reference_masked"]:
                failures = [json.loads(line) for line in (where / f"{env}_failures.jsonl").read_text().splitlines()]
                entry["reference_note"] = (f"{entry['reference_masked']} reference rollout(s) masked: "
                                           f"{str(failures[0].get('failure_reason'))[:120] if failures else '?'}")
            return
        failures = [json.loads(line) for line in (where / f"{env}_failures.jsonl").read_text().splitlines()]
        entry.update(rollouts=overall.get("num_scored", 0) + overall.get("num_masked", 0),
                     scored=overall.get("num_scored", 0), masked=overall.get("num_masked", 0),
                     mean_reward=overall.get("mean_reward"), failures=overall.get("failures", {}))
        if failures:
            entry["first_failure"] = str(failures[0].get("failure_reason"))[:200]
        if entry["masked"] and not entry["scored"]:
            entry["reason"] = f"every rollout masked: {str(entry.get('first_failure') or entry['failures'])[:90]}"

    (out_dir / "reference").mkdir(parents=True, exist_ok=True)
    async with client, reference_client:
        await asyncio.gather(*(one(env, kind, rows) for env, kind, rows in jobs))
    return [results[path.parent.name] for path in datasets]


def _reward(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def print_table(results: list[dict[str, Any]], console: Any) -> None:
    from rich.table import Table

    table = Table(title="gymserve demo: the embedded policy (SmolLM2-135M) next to the rows' reference answers")
    for column in ("environment", "rollouts", "mean reward", "reference (all rows)", "masked", "judge / note"):
        table.add_column(column, justify="left" if column in ("environment", "judge / note") else "right")
    for r in results:
        reference = _reward(r["reference_reward"])
        if r["reference_reward"] is not None and r.get("reference_max") not in (None, 1.0):
            reference += f" / {r['reference_max']:g}"
        notes = [n for n in (r.get("judge") and f"judge: {r['judge']}", r.get("reason"), r.get("reference_note")) if n]
        table.add_row(r["environment"], str(r["rollouts"]) if r["rollouts"] or "reason" not in r else "-",
                      _reward(r["mean_reward"]), reference, str(r["masked"]), "; ".join(notes))
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    parser = argparse.ArgumentParser(prog="python -m gymserve.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1, help="example rows per environment (default 1)")
    parser.add_argument("--reference-rows", type=int, default=None,
                        help="example rows per environment whose reference answers are scored (default all)")
    parser.add_argument("--repeats", type=int, default=1, help="policy rollouts per row (default 1)")
    parser.add_argument("--max-output-tokens", type=int, default=32, help="generation cap per model call")
    parser.add_argument("--concurrency", type=int, default=6, help="rollouts in flight across environments")
    parser.add_argument("--out", default=None, help="where rollouts go (default runs/demo)")
    parser.add_argument("--ready-timeout", type=float, default=900.0, help="seconds to wait for the stack")
    parser.add_argument("--rollout-deadline", type=float, default=300.0,
                        help="seconds one rollout may take (then it is masked as a timeout)")
    parser.add_argument("--head", default=None, help="use a running demo stack at this head URL")
    parser.add_argument("overrides", nargs="*", help="key=value overrides passed to gymserve up")
    args = parser.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # `timeout`, `kill`: stop the stack on the way out, as Ctrl-C does
    out_dir = Path(args.out or REPO / "runs" / "demo")
    out_dir.mkdir(parents=True, exist_ok=True)
    datasets = example_datasets()
    if not datasets:
        print("no datasets/*/example.jsonl found", file=sys.stderr)
        return 2
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(width=140, highlight=False)  # piped output (make demo | tee): do not squeeze the table
    phases: dict[str, float] = {}
    left_out: dict[str, str] = {}
    problem = sandbox_problem()
    if problem:
        left_out = {env: f"left out: {problem}" for env in SANDBOXED}
        console.print(f"terminal and swe are left out: {problem}")
    files = [STACKS / "default.yaml", demo_overlay(out_dir, list(left_out))]
    judges = judge_names(files)
    log = out_dir / "servers.log"
    stack = None
    started = time.monotonic()
    bars = Progress(TextColumn("{task.description:<20}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)
    try:
        with ExitStack() as cleanup:
            if args.head:
                head_url = args.head.rstrip("/")
            else:
                fast = policy_dtype_override(args.overrides)
                if fast:
                    console.print("the policy runs in bfloat16: this CPU has AMX "
                                  "(servers.policy_model.dtype=float32 keeps float32)")
                console.print(f"starting the demo stack (default + demo.yaml); server logs: {log}")
                stack = Stack(files, [*args.overrides, *fast], log)
                head_url = stack.head_url
                cleanup.callback(_stop, stack, console, phases)
            with bars:
                if stack is not None and not wait_ready(stack, args.ready_timeout, bars):
                    bars.stop()
                    console.print("the stack did not become ready; its last log lines:\n" + "\n".join(stack.lines[-20:]))
                    return 1
                phases["start-up"] = time.monotonic() - started
                t0 = time.monotonic()
                results = asyncio.run(run_demo(head_url, rows_per_env=args.rows, max_output_tokens=args.max_output_tokens,
                                               repeats=args.repeats, out_dir=out_dir, datasets=datasets,
                                               left_out=left_out, judges=judges, progress=bars,
                                               concurrency=args.concurrency, rollout_deadline_s=args.rollout_deadline,
                                               reference_rows=args.reference_rows))
                phases["collection"] = time.monotonic() - t0
            print_table(results, console)
            summary = out_dir / "summary.json"
            summary.write_text(json.dumps(results, indent=1) + "\n")
            off = [r for r in results if r["reference_max"] is not None and "reason" not in r
                   and (r["reference_reward"] is None or r["reference_reward"] < r["reference_max"])]
            for r in off:
                console.print(f"[bold red]{r['environment']}: the reference scored {_reward(r['reference_reward'])}, "
                              f"not its maximum {r['reference_max']:g}: see {out_dir}/reference/")
    except KeyboardInterrupt:
        console.print("interrupted: the stack was stopped")
        return 130
    console.print("phases: " + ", ".join(f"{name} {seconds:.0f}s" for name, seconds in phases.items())
                  + f" ({time.monotonic() - started:.0f}s in all)")
    console.print(f"wrote {out_dir}/<env>.jsonl (policy rollouts, _report.html per environment), "
                  f"{out_dir}/reference/ and {summary}")
    console.print(f"next: open {out_dir}/math_report.html, or `.venv/bin/gymserve up` and its dashboard, "
                  "then `gymserve collect` (docs/getting-started.md)")
    ran = [r for r in results if r["rollouts"]]
    return 0 if ran and not off else 1


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _stop(stack: Stack, console: Any, phases: dict[str, float]) -> None:
    t0 = time.monotonic()
    code = stack.stop()
    phases["stop"] = time.monotonic() - t0
    if code not in (0, None):
        console.print(f"the stack exited with code {code}; see {stack.log_path}")


if __name__ == "__main__":
    sys.exit(main())
