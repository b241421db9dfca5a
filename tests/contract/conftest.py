"""One server per environment, started once for the whole contract package (in parallel)."""
from __future__ import annotations

from typing import Iterator

import pytest

from gymserve.testing import ServerProcess

from .servers import ENVIRONMENTS, judge_server, options_for, start_all, stop_all


@pytest.fixture(scope="package")
def env_servers() -> Iterator[dict[str, ServerProcess]]:
    judge = judge_server()
    servers = {env: ServerProcess(f"resources/{env}", *options_for(env, judge), name=f"contract-{env}",
                                  ready_timeout_s=180) for env in ENVIRONMENTS}
    start_all([judge, *servers.values()])
    try:
        yield servers
    finally:
        stop_all([judge, *servers.values()])
