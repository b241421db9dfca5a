"""Which of NeMo-Gym's resources servers run here, and the exact reason for those that do not.

Two sources, in this order of authority: what the whole-catalogue run recorded when it tried each
server (built its virtualenv, started it, played its example rows through gymserve and NeMo-Gym's
own agent: `RESULTS`, written by `make catalogue`), and what a server's own files say it needs
(`static_reason`: its requirements.txt, its config block, its app.py), which decides the servers
that are not tried at all (a URL requirement, a container, a hosted model, a network API).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .wheel import ServerFiles

RESULTS = Path(__file__).with_name("catalogue-0.7.0.json")

# agents gymserve drives NeMo-Gym's resources servers with, by the agent NeMo-Gym's config pairs them with
OUR_AGENT_FOR = {"simple_agent": "agents/simple_agent"}


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def agents_of(files: ServerFiles) -> list[str]:
    """The NeMo-Gym agent implementations the server's config files pair it with."""
    found: list[str] = []
    for path in sorted((files.folder / "configs").glob("*.yaml")):
        for match in re.finditer(r"responses_api_agents:\s*\n\s+([a-z0-9_]+):", _text(path)):
            if match.group(1) not in found:
                found.append(match.group(1))
    return found


def _model_refs(block: dict[str, Any]) -> list[str]:
    return [k for k, v in block.items() if isinstance(v, dict) and v.get("type") == "responses_api_models"]


def static_reason(files: ServerFiles) -> str | None:
    """Why the server cannot run here, from its own files alone; None when nothing in them rules it out."""
    reqs = files.requirements
    urls = [r for r in reqs if "git+" in r or "://" in r or r.startswith(("-e ", "./", "../"))]
    if urls:
        return f"package not on the index: {urls[0].split(' @ ')[0].split('#')[0][:120]} (installed from a URL)"
    app = _text(files.app)
    configs = "\n".join(_text(p) for p in sorted((files.folder / "configs").glob("*.yaml")))
    if any(re.match(r"(torch|vllm|torchvision)\b", r) for r in reqs):
        return "GPU stack: requires torch and the model weights it loads at run time"
    if re.search(r"\b(docker|apptainer|singularity)\b", app + configs, re.IGNORECASE):
        return "container image: runs its tasks in containers (docker/apptainer)"
    block_text = json.dumps(files.block)
    refs = _model_refs(files.block)
    judge_off = any(files.block.get(k) is False for k in ("should_use_judge", "use_judge"))
    if refs and not judge_off:
        return f"hosted model: calls a model server ({', '.join(refs)}) to judge"
    keys = sorted(set(re.findall(r"\$\{(?:oc\.select:)?([a-z_]*(?:api_key|base_url|model_name))", block_text)))
    if keys or re.search(r"tavily|exa_api|serper|google_api", " ".join(reqs) + block_text, re.IGNORECASE):
        return f"network API: its config needs {', '.join(keys) or 'a search API key'}"
    if re.search(r"load_dataset\(|hf_hub_download|snapshot_download", app):
        return "dataset download: app.py downloads its data from the Hugging Face Hub at start"
    if "???" in block_text:
        return "config: a value its config leaves mandatory (???) has no default"
    return None


def recorded() -> dict[str, dict[str, Any]]:
    """The last whole-catalogue run's result per server ({} when none was recorded)."""
    if not RESULTS.exists():
        return {}
    return {r["name"]: r for r in json.loads(RESULTS.read_text())["servers"]}
