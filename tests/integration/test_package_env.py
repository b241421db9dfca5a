"""Environments from packages: `gymserve new env NAME --package DIR` writes a pip-installable environment
outside the checkout; built and installed into a fresh virtualenv (gymserve reached through a path file, so
only the new package is installed), it passes `gymserve check NAME`, and `gymserve up` serves it as
`kind: NAME` (its `gymserve.environments` entry point) and as `kind: module:attribute`, and `gymserve
collect` gets rollouts scored by it. No file of this repository changes."""
from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import httpx
import pytest

from tests.integration.up_helpers import Up

ROOT = Path(__file__).resolve().parents[2]
NAME = "pkgdemo"


def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh virtualenv's python, the package folder), the package scaffolded and installed."""
    before = _git_status()
    tmp = tmp_path_factory.mktemp("package")
    package = tmp / "pkg"
    made = subprocess.run([sys.executable, "-m", "gymserve", "new", "env", NAME, "--package", str(package)],
                          cwd=tmp, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    # gymserve (this checkout) and its dependencies, as a path file: nothing of ours is copied in
    Path(purelib, "gymserve_under_test.pth").write_text(f"{ROOT}\n{sysconfig.get_paths()['purelib']}\n")
    wheels = tmp / "wheels"  # built with this interpreter's setuptools, installed into the fresh virtualenv
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(package)], check=True, timeout=300)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *map(str, wheels.glob("*.whl"))],
                   check=True, timeout=300)
    yield str(python), package
    assert _git_status() == before  # nothing in the checkout was written


def test_scaffolded_package_passes_gymserve_check(installed):
    python, _ = installed
    check = subprocess.run([python, "-m", "gymserve", "check", NAME], capture_output=True, text=True, timeout=600)
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-3000:]
    assert "verify" in check.stdout


def test_gymserve_up_serves_and_collects_from_the_package(installed, tmp_path):
    python, package = installed
    rows = [json.loads(line) for line in (package / f"gymserve_{NAME}" / "example.jsonl").read_text().splitlines()]
    stack = tmp_path / "stack.yaml"
    stack.write_text(json.dumps({"head": {"port": 0}, "servers": {
        "policy": {"kind": "models/stub", "text": rows[0]["expected_answer"]},
        NAME: {"kind": NAME},
        f"{NAME}_by_attribute": {"kind": f"gymserve_{NAME}:app"},
        f"{NAME}_simple_agent": {"kind": "agents/simple_agent", "resources_server": NAME, "model_server": "policy"},
        "attr_agent": {"kind": "agents/simple_agent", "resources_server": f"{NAME}_by_attribute",
                       "model_server": "policy"}}}))
    up = Up("-c", str(stack), python=python, cwd=tmp_path)
    try:
        up.wait_for(r"all 6 servers ready", timeout_s=240)
        head = up.wait_for(r"head on (http://\S+)").group(1)
        listed = {r["name"]: r for r in httpx.get(f"{head}/server_instances", headers=up.auth, timeout=10).json()}
        for name in (NAME, f"{NAME}_by_attribute"):
            assert listed[name]["server_type"] == "resources_servers"
            assert listed[name]["openenv_url"] == listed[name]["url"] + "/openenv"
        data = tmp_path / "rows.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows)
                        + "".join(json.dumps({**r, "agent_ref": {**r["agent_ref"], "name": "attr_agent"}}) + "\n"
                                  for r in rows))
        out = tmp_path / "rollouts.jsonl"
        collected = subprocess.run([python, "-m", "gymserve", "collect", "-i", str(data), "-o", str(out), "--head", head],
                                   capture_output=True, text=True, timeout=300, env=up.env)
        assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
        rollouts = [json.loads(line) for line in out.read_text().splitlines()]
        rewards = sorted((r["agent_ref"]["name"], r["expected_answer"], r["reward"]) for r in rollouts)
        # the stub policy always answers the first row's answer: that row scores 1, the others 0, on both servers
        assert rewards == sorted((agent, row["expected_answer"], float(row is rows[0]))
                                 for agent in (f"{NAME}_simple_agent", "attr_agent") for row in rows)
    finally:
        up.kill()
