"""`GET /reverify_mode` as NeMo-Gym 0.7.0 defines it: `gym eval reverify` parses the reply as its
`ReverifyMode` and re-scores without `--force` only servers that answer "stateless". Ours answer
what NeMo-Gym's own servers of the same environment declare (mcqa: stateless; math, whose
verifier may ask a judge: unknown)."""
from __future__ import annotations

import pytest

from gymserve.testing import ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # the first compat test may install NeMo-Gym

NEMO_MODES = """
from nemo_gym.base_resources_server import ReverifyMode
from resources_servers.mcqa.app import MCQAResourcesServerConfig
from resources_servers.math_with_judge.app import LibraryJudgeMathResourcesServerConfig
theirs = {"mcqa": MCQAResourcesServerConfig.REVERIFY_MODE, "math": LibraryJudgeMathResourcesServerConfig.REVERIFY_MODE}
print(json.dumps({env: [ReverifyMode(mode).value, theirs[env].value] for env, mode in data.items()}))
"""


def test_reverify_mode_parses_as_nemo_gyms_and_matches_its_servers(nemo, workdir):
    ours = {}
    for env in ("mcqa", "math"):
        with ServerProcess(f"resources/{env}") as server:
            reply = server.get("/reverify_mode")
            assert reply.status_code == 200, reply.text
            ours[env] = reply.json()
    both = nemo.python_json(NEMO_MODES, ours, workdir)
    assert both == {"mcqa": ["stateless", "stateless"], "math": ["unknown", "unknown"]}
