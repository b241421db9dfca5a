"""gymserve/nemo_entrypoint.py: which server a NeMo-Gym config block names, and the errors a wrong block gets."""
from __future__ import annotations

import pytest
import yaml

from gymserve import nemo_entrypoint
from gymserve.nemo_entrypoint import server_block
from services.core.config import ConfigError

BLOCK = {"entrypoint": "app.py", "kind": "resources/math", "domain": "math", "host": "127.0.0.1", "port": 1234,
         "math_verify_timeout_s": 30}


def test_the_named_block_gives_the_kind_and_options():
    kind, block = server_block({"math": {"resources_servers": {"gymserve": BLOCK}}, "other": {}}, "math")
    assert kind == "resources/math" and block["math_verify_timeout_s"] == 30


@pytest.mark.parametrize("config,name,says", [
    ({"math": {"resources_servers": {"gymserve": BLOCK}}}, "nope", "NEMO_GYM_CONFIG_PATH"),
    ({"math": {"resources_servers": {"a": BLOCK, "b": BLOCK}}}, "math", "exactly one implementation"),
    ({"math": {"resources_servers": {"gymserve": {**BLOCK, "kind": None}}}}, "math", "set `kind`"),
    ({"math": {"resources_servers": {"gymserve": {**BLOCK, "kind": "math"}}}}, "math", "set `kind`"),
])
def test_a_wrong_block_is_a_config_error_that_says_what_to_fix(config, name, says):
    with pytest.raises(ConfigError, match=says):
        server_block(config, name)


def test_beyond_loopback_without_a_key_is_refused(monkeypatch):
    config = {"math": {"resources_servers": {"gymserve": {**BLOCK, "host": "0.0.0.0"}}}}
    monkeypatch.setenv("NEMO_GYM_CONFIG_DICT", yaml.safe_dump(config))
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "math")
    for name in ("GYMSERVE_API_KEY", "GYMSERVE_API_KEY_FILE", "GYMSERVE_NO_AUTH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(nemo_entrypoint, "follow_the_parent", lambda: None)
    with pytest.raises(ConfigError, match="beyond loopback"):
        nemo_entrypoint.main()


def test_an_unknown_option_names_itself(monkeypatch):
    config = {"math": {"resources_servers": {"gymserve": {**BLOCK, "no_such_option": 1}}}}
    monkeypatch.setenv("NEMO_GYM_CONFIG_DICT", yaml.safe_dump(config))
    monkeypatch.setenv("NEMO_GYM_CONFIG_PATH", "math")
    monkeypatch.setenv("GYMSERVE_API_KEY", "k")
    monkeypatch.setattr(nemo_entrypoint, "follow_the_parent", lambda: None)
    with pytest.raises(ConfigError, match="no_such_option"):
        nemo_entrypoint.main()
