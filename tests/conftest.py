"""Test-session hygiene: the suite leaves nothing of its own in the temp folder."""
from __future__ import annotations

import getpass
import tempfile
from pathlib import Path

import pytest


def pytest_unconfigure(config: pytest.Config) -> None:
    # pytest's tmp_path root (emptied by tmp_path_retention_policy = "none") and the folder torch
    # creates for its compile cache on import: removed when empty, never when something is left in them.
    user = getpass.getuser()
    for name in (f"pytest-of-{user}", f"torchinductor_{user}"):
        try:
            (Path(tempfile.gettempdir()) / name).rmdir()
        except OSError:
            pass
