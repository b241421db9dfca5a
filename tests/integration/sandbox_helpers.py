"""A workspace folder root for one test: reachable by the sandbox user (uid 65534 when the tests run as
root, which pytest's private tmp_path is not), removed afterwards."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def sandbox_dir() -> Iterator[Path]:
    where = Path(tempfile.mkdtemp(prefix="gymserve-test-ws-"))
    os.chmod(where, 0o755)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)
