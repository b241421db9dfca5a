"""The `nemo_gym/<server>` kind's plumbing that needs no NeMo-Gym: the config NeMo-Gym's server is given
(the stack entry's options over its own block, loopback whatever they say), the sidecar's own settings
kept out of it, and bad kinds refused by name before anything starts."""
from __future__ import annotations

from pathlib import Path

import pytest

from gymserve.commands.serve import load_config
from gymserve.launcher import plan
from gymserve.nemo_gym.sidecar import Config, nemo_server_name
from gymserve.nemo_gym.upstream import nemo_config
from gymserve.nemo_gym.wheel import ServerFiles
from services.core.app import server_type_name
from services.core.config import ConfigError, Stack, build_server_config


def files() -> ServerFiles:
    return ServerFiles(name="mcqa", folder=Path("/nowhere/mcqa"), config_file=None, instance="mcqa", impl="mcqa",
                       block={"entrypoint": "app.py", "grading_mode": None, "domain": "knowledge"}, requirements=[])


def test_stack_options_reach_nemo_gyms_config_on_loopback():
    config = nemo_config(files(), "mcqa", 4321, {"grading_mode": "strict_single_letter_boxed", "host": "0.0.0.0"},
                         head=("127.0.0.1", 11000))
    block = config["mcqa"]["resources_servers"]["mcqa"]
    assert block["grading_mode"] == "strict_single_letter_boxed" and block["domain"] == "knowledge"
    assert (block["host"], block["port"]) == ("127.0.0.1", 4321)
    assert config["head_server"] == {"host": "127.0.0.1", "port": 11000} and config["dry_run"] is False


def test_the_sidecars_settings_are_not_nemo_gyms_options():
    config = build_server_config(Config, {"kind": "nemo_gym/mcqa", "name": "m", "request_deadline_s": 5,
                                          "grading_mode": "lenient"}, where="test")
    assert isinstance(config, Config)
    assert config.nemo_options() == {"grading_mode": "lenient"} and config.request_deadline_s == 5


@pytest.mark.parametrize("kind", ["nemo_gym/", "nemo_gym/a/b", "nemo_gym/../x", "nemo_gym/a b"])
def test_a_malformed_kind_is_refused(kind):
    with pytest.raises(ConfigError, match="nemo_gym/<resources server"):
        nemo_server_name(kind)
    with pytest.raises(ConfigError, match="servers.x"):
        plan(Stack.model_validate({"head": {"port": 0}, "servers": {"x": {"kind": kind}}}))


def test_the_kind_family_plugs_into_serve_and_the_head():
    assert server_type_name("nemo_gym/mcqa") == "resources_servers"
    with pytest.raises(ConfigError, match="nemo_gym/<resources server"):
        load_config("nemo_gym/", [])
