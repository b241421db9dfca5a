"""One server per environment, started once for the whole contract package (in parallel)."""
from __future__ import annotations

from typing import Iterator

import pytest

from gymserve.testing import ServerProcess

from .servers import ENVIRONMENTS, start_all, stop_all


@pytest.fixture(scope="package")
def env_servers() -> Iterator[dict[str, ServerProcess]]:
    servers = {env: ServerProcess(f"resources/{env}", *options, name=f"contract-{env}", ready_timeout_s=180)
               for env, options in ENVIRONMENTS.items()}
    start_all(list(servers.values()))
    try:
        yield servers
    finally:
        stop_all(list(servers.values()))
