"""docs/catalogue.md, generated from the whole-catalogue run's results (`make catalogue` writes both;
`tests/compat/test_catalogue_page.py` fails when the page and the results differ)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from gymserve.nemo_gym.catalogue import OUR_AGENT_FOR, RESULTS

PAGE = Path(__file__).resolve().parents[2] / "docs" / "catalogue.md"

HEADER = """# Catalogue

Every environment gymserve can serve: its own (`gymserve catalogue` lists them with NeMo-Gym's and
those of installed packages; `--json` for a machine) and NeMo-Gym 0.7.0's resources servers, each run
unchanged from the `nemo-gym` wheel behind gymserve as `kind: nemo_gym/<server>`
([how](nemo-gym-compat.md#nemo-gyms-servers-behind-gymserve)).

This page is generated from `gymserve/nemo_gym/catalogue-0.7.0.json`, which `make catalogue` writes:
for every server of the wheel it records why the server's own files rule it out (a requirement
installed from a URL, torch, containers, a hosted judge model, a network API, a dataset download),
else builds its virtualenv, starts it with `gymserve up` and plays its `data/example.jsonl` rows with
the scripted policy of its recorded rollouts, once through gymserve (`gymserve collect`, our head,
our key, the sidecar) and once through NeMo-Gym's own `simple_agent` against the same server process;
*agrees* means every reward is equal. `make test` runs the same comparison for a subset
(`tests/compat/test_nemo_gym_hosted.py`).
"""


def load() -> dict[str, Any]:
    return json.loads(RESULTS.read_text()) if RESULTS.exists() else {"servers": []}


def counts(servers: list[dict[str, Any]]) -> dict[str, int]:
    return {"total": len(servers), "runs": sum(bool(s["runs_here"]) for s in servers),
            "agree": sum(s.get("agrees") is True for s in servers),
            "untried": sum(s.get("reason") == "not tried yet" for s in servers)}


def category(reason: str | None) -> str:
    return (reason or "").split(":", 1)[0]


def render(data: dict[str, Any] | None = None) -> str:
    data = data or load()
    servers = data["servers"]
    c = counts(servers)
    lines = [HEADER, "## NeMo-Gym 0.7.0's resources servers", "",
             f"Of the wheel's {c['total']} resources servers, **{c['agree']} run behind gymserve and agree with "
             f"NeMo-Gym's own agent** on their example rows; {c['runs']} start and serve here in all"
             + (f"; {c['untried']} were not tried yet" if c["untried"] else "") + f" (run of {data.get('generated', '-')}).",
             "", "| why the others do not run here | servers |", "|---|---|"]
    for cat, n in Counter(category(s.get("reason")) for s in servers if not s["runs_here"]).most_common():
        lines.append(f"| {cat} | {n} |")
    lines += ["", "| server | runs here | agrees | rows | agent in its config | reason or note |", "|---|---|---|---|---|---|"]
    for s in servers:
        agents = ", ".join(s.get("agents") or []) or "-"
        agree = {True: "yes", False: "**no**", None: "-"}[s.get("agrees")]
        note = s.get("reason") or s.get("note") or ""
        lines.append(f"| {s['name']} | {'yes' if s['runs_here'] else 'no'} | {agree} | {s.get('rows') or '-'} | "
                     f"{agents} | {note.replace('|', '/')} |")
    lines += ["", "## Agents", "",
              "gymserve's own agents drive NeMo-Gym's resources servers where they do the same job (preferred: "
              "they bring deadlines, masking and token data); NeMo-Gym's other agents are not hosted yet.", "",
              "| NeMo-Gym agent | servers whose config uses it | driven here by |", "|---|---|---|"]
    used = Counter(a for s in servers for a in s.get("agents") or [])
    for agent, n in sorted(used.items(), key=lambda kv: (-kv[1], kv[0])):
        lines.append(f"| {agent} | {n} | {OUR_AGENT_FOR.get(agent, 'not hosted (no gymserve equivalent yet)')} |")
    return "\n".join(lines) + "\n"


def write() -> None:
    PAGE.write_text(render())
