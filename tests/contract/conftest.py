"""One server per environment, started once for the whole contract package (in parallel)."""
from __future__ import annotations

from typing import Iterator

import pytest

from gymserve.testing import ServerProcess

from .servers import running_environments


@pytest.fixture(scope="package")
def env_servers() -> Iterator[dict[str, ServerProcess]]:
    with running_environments("contract") as servers:
        yield servers
