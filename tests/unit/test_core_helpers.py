"""The shared one-job helpers: message content as text, bind address -> connect address."""
from __future__ import annotations

import pytest

from services.core.content import content_text, strict_content_text
from services.core.errors import BadRequest
from services.core.hosts import connect_host, connect_url


def test_content_text_reads_every_shape():
    assert content_text("hi") == "hi"
    assert content_text(None) == ""
    assert content_text([{"type": "input_text", "text": "a"}, "b", {"type": "output_text", "text": "c"},
                         {"text": "d"}, {"type": "input_image", "image_url": "x"}, {"type": "refusal", "refusal": "no"}]) \
        == "abcdno"
    assert content_text(3) == "3"


def test_strict_content_text_names_the_bad_part():
    assert strict_content_text([{"type": "text", "text": "x"}], "conversation[0]") == "x"
    with pytest.raises(BadRequest, match=r"conversation\[0\]\.content\[1\]"):
        strict_content_text([{"type": "text", "text": "x"}, {"type": "input_image"}], "conversation[0]")
    with pytest.raises(BadRequest, match="content: missing"):
        strict_content_text(None, "m")


def test_connect_host_and_url():
    assert connect_host("0.0.0.0") == "127.0.0.1"
    assert connect_host("") == "127.0.0.1"
    assert connect_host("::") == "::1"
    assert connect_host("10.1.2.3") == "10.1.2.3"
    assert connect_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert connect_url("::", 81) == "http://[::1]:81"
    assert connect_url("head", 11000) == "http://head:11000"
