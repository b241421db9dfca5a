"""The compose files pass a real Compose `config` check (the GPU override cannot run here: no GPU)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _config(*files: str) -> dict:
    # engine.sh finds (or, as root, installs) Compose; `config` itself needs no running engine
    script = ('. deploy/docker/engine.sh; command -v docker-compose >/dev/null || _gs_apt_install docker-compose; '
              'docker-compose ' + " ".join(f"-f {f}" for f in files) + " config")
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              "GYMSERVE_API_KEY": "", "HOME": str(Path.home())})
    assert out.returncode == 0, out.stderr[-3000:]
    return yaml.safe_load(out.stdout)


def test_default_compose_file_resolves():
    services = _config("docker-compose.yml")["services"]
    port = services["head"]["ports"][0]  # Compose v1 prints the short form, v2 the long one
    assert (port.split(":")[0] if isinstance(port, str) else port["host_ip"]) == "127.0.0.1"
    assert services["policy_model"]["command"][1] == "models/hf"
    # every server may register with the head: its name is on the head's allow-list
    allowed = {h.strip() for h in services["head"]["environment"]["GYMSERVE_ALLOWED_HOSTS"].split(",")}
    servers = {name for name, spec in services.items() if name != "head" and (spec.get("command") or [""])[0] == "serve"}
    assert servers and servers <= allowed, sorted(servers - allowed)


def test_gpu_override_resolves_to_vllm_behind_the_openai_proxy():
    services = _config("docker-compose.yml", "deploy/docker/compose.gpu.yml")["services"]
    assert services["policy_model"]["command"][1] == "models/openai_proxy"
    assert "base_url=http://vllm:8000/v1" in services["policy_model"]["command"]
    devices = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert devices[0]["capabilities"] == ["gpu"]
