"""Secret shapes for the redaction tests: each is a text as a config value or a message would carry it,
and the part of it that must never come back. Shared by the config-endpoint and error-reply tests."""
from __future__ import annotations

# one recognisable secret per shape, so a leak names the shape that leaked
_S = "Zq7vK2mXw9Lp4RtY8nB3cD6f"  # 24 characters: looks like a credential, in no word list


def _s(n: int) -> str:
    return f"{_S}{n:02d}"


# (id, text, the secret it carries)
SHAPES: list[tuple[str, str, str]] = [
    ("url-user-password", f"http://bob:{_s(1)}@127.0.0.1:9/v1", _s(1)),
    ("url-token-only", f"https://{_s(2)}@github.com/org/repo.git", _s(2)),
    ("url-token-only-x-oauth", f"https://x-oauth-basic:{_s(3)}@github.com/o/r", _s(3)),
    ("url-query-access-token", f"https://host/cb?access_token={_s(4)}&x=1", _s(4)),
    ("url-query-key", f"https://maps.invalid/api?key={_s(5)}", _s(5)),
    ("url-query-sas-sig", f"https://acct.blob.invalid/c/b?sv=2024&sig={_s(6)}", _s(6)),
    ("url-query-amz-signature", f"https://s3.invalid/o?X-Amz-Credential=A&X-Amz-Signature={_s(7)}", _s(7)),
    ("authorization-bearer", f"Authorization: Bearer {_s(8)}", _s(8)),
    ("authorization-token-scheme", f"Authorization: Token {_s(9)}", _s(9)),
    ("authorization-apikey-scheme", f"authorization=ApiKey {_s(10)}", _s(10)),
    ("basic-credentials", "Basic dXNlcjpaUTd2SzJtWHc5THA0UnRZOG5CM2NENmYxMQ==", "dXNlcjpaUTd2SzJtWHc5THA0UnRZOG5CM2NENmYxMQ"),
    ("cookie-header", f"Cookie: session={_s(12)}", _s(12)),
    ("password-assignment", f"password={_s(13)}", _s(13)),
    ("json-password", f'{{"db_password": "{_s(14)}"}}', _s(14)),
    ("passphrase-assignment", f"ssh_passphrase={_s(15)}", _s(15)),
    ("cli-flag", f"run.sh --api-key {_s(16)} --verbose", _s(16)),
    ("env-export", f"export OPENAI_API_KEY={_s(17)}", _s(17)),
    ("github-pat", f"token ghp_{_s(18)}abcdefgh in the log", f"ghp_{_s(18)}"),
    ("github-fine-grained", f"github_pat_11AB{_s(19)}_xyz", f"github_pat_11AB{_s(19)}"),
    ("openai-key", f"sk-proj-{_s(20)}", f"sk-proj-{_s(20)}"),
    ("anthropic-key", f"sk-ant-api03-{_s(21)}", f"sk-ant-api03-{_s(21)}"),
    ("huggingface-token", f"hf_{_s(22)}", f"hf_{_s(22)}"),
    ("aws-access-key-id", "AKIAZQ7VK2MXW9LP4RTY", "AKIAZQ7VK2MXW9LP4RTY"),
    ("google-api-key", "AIzaSyZq7vK2mXw9Lp4RtY8nB3cD6f001122334", "AIzaSyZq7vK2mXw9Lp4RtY8nB3cD6f001122334"),
    ("slack-bot-token", f"xoxb-1234-{_s(25)}", f"xoxb-1234-{_s(25)}"),
    ("gitlab-pat", f"glpat-{_s(26)}", f"glpat-{_s(26)}"),
    ("jwt", f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{_s(27)}.{_s(27)}sig", f"eyJzdWIiOiJ{_s(27)}"),
    ("pem-private-key", f"-----BEGIN RSA PRIVATE KEY-----\nMIIE{_s(28)}\n-----END RSA PRIVATE KEY-----", _s(28)),
    ("stripe-live-key", f"sk_live_{_s(29)}", f"sk_live_{_s(29)}"),
    ("dsn-empty-user", f"redis://:{_s(30)}@cache:6379/0", _s(30)),
]

# texts that name secrets without carrying any: they must come back unchanged
HARMLESS = [
    "ssh://git@github.com/org/repo.git", "https://host:8080/v1/models?limit=5", "max_tokens=5 exceeded",
    "api_key: expected a string", "missing bearer token (set Authorization: Bearer <KEY>)",
    "the tokenizer split 12 tokens", "Basic idea", "pass_rate=0.5",
]
