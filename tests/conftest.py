"""Test-session hygiene: the suite leaves nothing of its own in the temp folder or the user's home, and
no test's API key leaks into the next one."""
from __future__ import annotations

import getpass
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

# What decides which key a server enforces and a client sends (services/core/auth.py).
KEY_VARIABLES = ("GYMSERVE_API_KEY", "GYMSERVE_API_KEY_FILE", "GYMSERVE_NO_AUTH")
_config_home: str | None = None
_basetemp: str | None = None


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    # `gymserve up` (the demo, the launcher tests) writes a generated key to $XDG_CONFIG_HOME/gymserve/api_key
    # and clients adopt that file: a private config folder for the session keeps the user's real key out of
    # the tests and the tests' keys out of the user's home.
    global _config_home, _basetemp
    _config_home = tempfile.mkdtemp(prefix="gymserve-test-config-")
    os.environ["XDG_CONFIG_HOME"] = _config_home
    # tmp_path_retention_policy = "none" leaves pytest's numbered tmp folders unlocked, and any other pytest
    # session of the same user (one a test starts, e.g. the scaffold test's) deletes every unlocked one when it
    # ends: this session's tmp_path root is a folder of its own instead
    if config.option.basetemp is None:
        _basetemp = config.option.basetemp = tempfile.mkdtemp(prefix="gymserve-pytest-")
    # Ray 2.60 writes a token into ~/.ray/auth_token on its first `ray.init` and then turns token auth on for
    # every later cluster of the user: the suite's loopback clusters run without, and leave the home alone
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")


def _key_state_restored() -> Iterator[None]:
    """A key generated into the default file (`gymserve up` with no key: the demo, the launcher tests) or
    adopted by a client (`adopt_default_key` sets GYMSERVE_API_KEY_FILE in this process) must not make the
    servers and clients of later tests use it: both are put back as they were."""
    saved = {name: os.environ.get(name) for name in KEY_VARIABLES}
    key_dir = Path(os.environ["XDG_CONFIG_HOME"]) / "gymserve"
    existed = key_dir.exists()
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if not existed:
        shutil.rmtree(key_dir, ignore_errors=True)


# per module (a module's own fixtures may generate the key its tests share) and per test
_module_key_state = pytest.fixture(scope="module", autouse=True)(_key_state_restored)
_test_key_state = pytest.fixture(autouse=True)(_key_state_restored)


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in (_config_home, _basetemp):
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    # pytest's tmp_path root (emptied by tmp_path_retention_policy = "none") and the folder torch
    # creates for its compile cache on import: removed when empty, never when something is left in them.
    user = getpass.getuser()
    for name in (f"pytest-of-{user}", f"torchinductor_{user}"):
        try:
            (Path(tempfile.gettempdir()) / name).rmdir()
        except OSError:
            pass
