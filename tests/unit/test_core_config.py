"""Config: stack files, key=value overrides, ${ENV}, secret files, redaction, errors that name key and file."""
from __future__ import annotations

import pytest

from services.core.config import (ConfigError, ServerConfig, apply_overrides, build_server_config, interpolate,
                                  load_stack, parse_override, redact, spec_from_env)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_overrides_are_typed_and_nested():
    data = apply_overrides({"head": {"port": 11000}}, ["head.port=12000", "servers.math.workers=2",
                                                        "servers.math.flag=true", "servers.math.tags=[a, b]",
                                                        "servers.math.label=hello world",
                                                        "servers.math.rate=1e-4"])
    assert data["head"]["port"] == 12000
    assert data["servers"]["math"] == {"workers": 2, "flag": True, "tags": ["a", "b"], "label": "hello world",
                                       "rate": 1e-4}
    with pytest.raises(ConfigError, match="expected key=value"):
        parse_override("no-equals-sign")


def test_stack_files_merge_in_order_and_overrides_win(tmp_path):
    a = write(tmp_path, "a.yaml", "head: {port: 11500}\nservers:\n  em: {kind: resources/exact_match, x: 1}\n")
    b = write(tmp_path, "b.yaml", "servers:\n  em: {y: 2}\n  other: {kind: resources/math, port: 9001}\n")
    stack = load_stack([a, b], ["servers.em.x=5"])
    assert stack.head.port == 11500
    assert stack.servers["em"].kind == "resources/exact_match"
    assert stack.servers["em"].options == {"x": 5, "y": 2}
    assert stack.servers["other"].port == 9001


def test_a_stack_file_replaces_a_server_whole_and_an_override_removes_a_key(tmp_path):
    """Swapping the default stack's policy for the stub: `_replace: true` drops the earlier keys
    (models/hf's options would fail models/stub's check), `~key` removes one key."""
    a = write(tmp_path, "a.yaml", "servers:\n  policy: {kind: models/hf, max_batch_size: 4, device: cpu}\n"
                                  "  em: {kind: resources/exact_match, x: 1, y: 2}\n")
    b = write(tmp_path, "b.yaml", "servers:\n  policy:\n    _replace: true\n    kind: models/stub\n"
                                  "    script: [{text: Paris}]\n")
    stack = load_stack([a, b], ["~servers.em.y"])
    assert stack.servers["policy"].kind == "models/stub"
    assert stack.servers["policy"].options == {"script": [{"text": "Paris"}]}
    assert stack.servers["em"].options == {"x": 1}
    merged = load_stack([a, write(tmp_path, "c.yaml", "servers:\n  policy: {kind: models/stub}\n")])
    assert merged.servers["policy"].options == {"max_batch_size": 4, "device": "cpu"}  # merging keeps them
    with pytest.raises(ConfigError, match="no servers.em.z to remove"):
        load_stack([a], ["~servers.em.z"])
    with pytest.raises(ConfigError, match="expected ~key"):
        load_stack([a], ["~servers.em.x=3"])


def test_stack_error_names_file_and_key(tmp_path):
    bad = write(tmp_path, "bad.yaml", "servers:\n  em: {kind: resources/exact_match, port: 99999}\n")
    with pytest.raises(ConfigError) as info:
        load_stack([bad])
    assert str(bad) in str(info.value) and "servers.em.port" in str(info.value)
    missing_kind = write(tmp_path, "nokind.yaml", "servers:\n  em: {port: 1}\n")
    with pytest.raises(ConfigError, match=r"servers\.em\.kind"):
        load_stack([missing_kind])
    broken = write(tmp_path, "broken.yaml", "servers: [\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_stack([broken])
    with pytest.raises(ConfigError, match="cannot read"):
        load_stack([tmp_path / "absent.yaml"])


def test_env_interpolation_with_default_and_missing(monkeypatch):
    monkeypatch.setenv("GS_TEST_URL", "http://x:1")
    monkeypatch.delenv("GS_TEST_ABSENT", raising=False)
    out = interpolate({"a": "${GS_TEST_URL}/v1", "b": ["${GS_TEST_ABSENT:-fallback}"], "c": 3})
    assert out == {"a": "http://x:1/v1", "b": ["fallback"], "c": 3}
    with pytest.raises(ConfigError) as info:
        interpolate({"servers": {"m": {"api_key": "${GS_TEST_ABSENT}"}}}, where="stack.yaml")
    assert "GS_TEST_ABSENT" in str(info.value) and "stack.yaml.servers.m.api_key" in str(info.value)


class _SecretConfig(ServerConfig):
    api_key: str | None = None
    workers: int = 1


def test_secret_file_becomes_the_option(tmp_path):
    secret = write(tmp_path, "key.txt", "s3cret-value\n")
    config = build_server_config(_SecretConfig, {"api_key_file": str(secret)}, where="m options")
    assert config.api_key == "s3cret-value"
    with pytest.raises(ConfigError) as info:
        build_server_config(_SecretConfig, {"api_key_file": str(tmp_path / "nope")}, where="m options")
    assert "m options.api_key_file" in str(info.value)


def test_server_option_error_names_key():
    with pytest.raises(ConfigError) as info:
        build_server_config(_SecretConfig, {"workers": "many"}, where="resources/x options")
    assert "resources/x options" in str(info.value) and "workers" in str(info.value)
    with pytest.raises(ConfigError, match="unknown_opt"):
        build_server_config(_SecretConfig, {"unknown_opt": 1}, where="x")


def test_redact_hides_every_secret_named_key():
    config = {"api_key": "a", "nested": {"auth_token": "b", "db_password": "c", "client_secret": "d",
                                         "model": "m", "KEY_ID": "e"}, "list": [{"token": "f"}], "empty_key": ""}
    out = redact(config)
    assert out["api_key"] == "***" and out["nested"]["auth_token"] == "***"
    assert out["nested"]["db_password"] == "***" and out["nested"]["client_secret"] == "***"
    assert out["nested"]["KEY_ID"] == "***" and out["list"][0]["token"] == "***"
    assert out["nested"]["model"] == "m"
    assert config["api_key"] == "a"  # the original is untouched


def test_spec_from_env(monkeypatch):
    monkeypatch.setenv("GYMSERVE_SERVER_SPEC", '{"workers": 3}')
    assert spec_from_env() == {"workers": 3}
    monkeypatch.setenv("GYMSERVE_SERVER_SPEC", "{oops")
    with pytest.raises(ConfigError, match="GYMSERVE_SERVER_SPEC"):
        spec_from_env()
    monkeypatch.setenv("GYMSERVE_SERVER_SPEC", "[1]")
    with pytest.raises(ConfigError, match="JSON object"):
        spec_from_env()
