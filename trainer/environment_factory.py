"""TRL `environment_factory`: gymserve resource servers as GRPOTrainer environments.

    factories = environments(["workplace", "code"], head_url=HEAD)   # {name: factory}
    GRPOTrainer(..., environment_factory=factories, reward_funcs=[completion_recorder],
                train_dataset=environment_dataset(rows))  # rows carry `environment`

Each factory builds instances of a class generated from the resource server's OpenAPI: every
`POST /{tool}` (tag `tools`) becomes a typed method with a Google-style docstring, which TRL turns
into a tool schema and calls during its own tool-calling generation. `reset(**row)` opens a
session (`/seed_session` with the row) and returns the row's prompt text, which TRL appends to
the last user message. `get_reward()` sends the trajectory the instance saw (tool calls, their
outputs and the final completion handed over by `completion_recorder`) to `/verify` on that
session; a masked verify returns `None`, which TRL treats as unscorable (no baseline share,
advantage 0), never 0.
"""
from __future__ import annotations

import inspect
import json
import logging
from typing import Any, Callable, Iterable, Optional

import httpx

from services.core.affinity import CALL_SEQ_HEADER, REPLICA_HEADER
from services.core.auth import auth_headers
from services.core.content import content_text
from services.core.directory import Directory
from services.core.resource import CLOSE_SESSION_HEADER

from .client import run_sync
from .trl import ROW_COLUMN

log = logging.getLogger("gymserve.trainer.environment_factory")
ENV_COLUMN = "environment"
_JSON_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool,
                                "array": list, "object": dict}


def _resolve(schema: dict[str, Any], spec: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        node: Any = spec
        for part in ref[2:].split("/"):
            node = node.get(part, {})
        return _resolve(node, spec)
    return schema


def _python_type(schema: dict[str, Any]) -> type:
    if "type" in schema and schema["type"] in _JSON_TYPES:
        return _JSON_TYPES[schema["type"]]
    for option in schema.get("anyOf") or schema.get("oneOf") or []:
        if option.get("type") in _JSON_TYPES and option.get("type") != "null":
            return _JSON_TYPES[option["type"]]
    return str


def tool_specs(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, description, JSON schema of the arguments) of every tool route in an OpenAPI document."""
    out = []
    for path, ops in sorted((spec.get("paths") or {}).items()):
        op = ops.get("post") if isinstance(ops, dict) else None
        if not op or "tools" not in (op.get("tags") or []):
            continue
        body = (((op.get("requestBody") or {}).get("content") or {}).get("application/json") or {}).get("schema")
        out.append((path.strip("/"), (op.get("description") or op.get("summary") or path).strip(),
                    _resolve(body or {}, spec)))
    return out


def _tool_method(name: str, description: str, schema: dict[str, Any]) -> Callable[..., str]:
    """A method `name(self, <typed arguments>) -> str` that calls `POST /name` on the instance's session."""
    props: dict[str, Any] = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {}
    doc_args = []
    for arg in sorted(props, key=lambda a: a not in required):  # required first: a valid signature
        prop = _resolve(props[arg], {}) if isinstance(props[arg], dict) else {}
        kind = _python_type(prop)
        annotation: Any = kind if arg in required else Optional[kind]
        default = inspect.Parameter.empty if arg in required else None
        params.append(inspect.Parameter(arg, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation))
        annotations[arg] = annotation
        text = " ".join(str(prop.get("description") or prop.get("title") or arg).split())
        doc_args.append(f"    {arg}: {text}")
    annotations["return"] = str

    def method(self: GymserveEnvironment, **arguments: Any) -> str:
        return self._call_tool(name, {k: v for k, v in arguments.items() if v is not None})

    method.__name__ = method.__qualname__ = name
    method.__signature__ = inspect.Signature(params, return_annotation=str)  # type: ignore[attr-defined]
    method.__annotations__ = annotations
    summary = " ".join(description.split()) or f"The {name} tool."
    method.__doc__ = summary + ("\n\nArgs:\n" + "\n".join(doc_args) if doc_args else "")
    return method


class GymserveEnvironment:
    """One rollout's view of a resource server: a session, the tool calls made on it, the reward."""

    url: str = ""
    environment: str = ""
    timeout_s: float = 300.0

    def __init__(self) -> None:
        self._http = httpx.Client(base_url=self.url, timeout=self.timeout_s, headers=auth_headers())
        self._session: str | None = None
        self._owner: str | None = None  # the replica holding the session (its own address), when it says
        self._calls = 0
        self._direct = True
        self._row: dict[str, Any] = {}
        self._items: list[dict[str, Any]] = []
        self._completion = ""
        self.last_reply: dict[str, Any] | None = None

    def reset(self, **row: Any) -> str:
        """Open a session seeded with the row; the prompt text goes to TRL."""
        self._close()
        if ROW_COLUMN in row:
            row = json.loads(row[ROW_COLUMN]) if isinstance(row[ROW_COLUMN], str) else dict(row[ROW_COLUMN])
        self._row = {k: v for k, v in row.items() if k not in ("prompt", ENV_COLUMN)}
        self._items, self._completion, self.last_reply = [], "", None
        reply = self._http.post("/seed_session", json=self._row)
        if reply.status_code >= 400:
            raise ValueError(f"{self.environment}: /seed_session rejected the row ({reply.status_code}): "
                             f"{reply.text[:300]}")
        self._session = reply.json()["session_id"]
        self._owner = reply.headers.get(REPLICA_HEADER) or None
        self._direct = True
        self._calls = 0
        return prompt_text(self._row)

    def _session_post(self, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        """A call of the session: to its replica directly; through the balanced address (where another
        replica rebuilds the session) when that replica is gone."""
        headers = {"X-Session-Id": self._session or "", **headers}
        if self._owner and self._direct:
            try:
                reply = self._http.post(self._owner.rstrip("/") + path, json=body, headers=headers,
                                        timeout=httpx.Timeout(self.timeout_s, connect=5.0))
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError):
                # gone, or not reachable from here (a trainer outside a compose network): the balanced
                # address from now on, where the owner is found (or the session rebuilt) for us
                self._direct = False
            else:
                self._owner = reply.headers.get(REPLICA_HEADER) or self._owner
                return reply
        return self._http.post(path, json=body, headers=headers)

    def _call_tool(self, name: str, arguments: dict[str, Any]) -> str:
        call_id = f"call_{len(self._items)}"
        self._items.append({"type": "function_call", "call_id": call_id, "name": name,
                            "arguments": json.dumps(arguments), "status": "completed"})
        self._calls += 1  # a call sent again after its replica died is answered from the session's journal
        reply = self._session_post(f"/{name}", arguments, {CALL_SEQ_HEADER: str(self._calls)})
        text = reply.text if reply.status_code < 400 else f"Error {reply.status_code}: {reply.text}"
        self._items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        return text

    def _record_completion(self, completion: Any) -> None:
        """The final assistant text of the rollout (TRL passes it to reward functions, not to the env)."""
        if isinstance(completion, list):
            completion = "".join(content_text(m.get("content")) for m in completion
                                 if isinstance(m, dict) and m.get("role") == "assistant")
        self._completion = str(completion or "")

    def get_reward(self) -> float | None:
        """`/verify` on this session; None (unscorable for TRL) when the verify is masked."""
        output = [*self._items, {"type": "message", "role": "assistant", "status": "completed",
                                 "content": [{"type": "output_text", "text": self._completion, "annotations": []}]}]
        body = {**self._row, "response": {"object": "response", "status": "completed", "output": output}}
        body.setdefault("responses_create_params", {"input": [{"role": "user", "content": prompt_text(self._row)}]})
        try:
            reply = self._session_post("/verify", body, {CLOSE_SESSION_HEADER: "1"})
            self._session = None  # closed by the verify
        except httpx.HTTPError as exc:
            log.warning("%s: /verify failed (%s); the rollout is unscorable", self.environment, exc)
            return None
        if reply.status_code >= 400:
            log.warning("%s: /verify answered %d (%s); the rollout is unscorable", self.environment,
                        reply.status_code, reply.text[:300])
            return None
        self.last_reply = reply.json()
        if self.last_reply.get("mask_sample"):
            log.warning("%s: masked verify (%s: %s)", self.environment, self.last_reply.get("failure_kind"),
                        self.last_reply.get("failure_reason"))
            return None
        return float(self.last_reply["reward"])

    def _close(self) -> None:
        if self._session:
            try:
                self._http.post("/close_session", json={"session_id": self._session})
            except httpx.HTTPError:
                pass
            self._session = None


def prompt_text(row: dict[str, Any]) -> str:
    """The row's user text (`responses_create_params.input`), what `reset` hands to TRL."""
    messages = (row.get("responses_create_params") or {}).get("input") or []
    if isinstance(messages, str):
        return messages
    return "\n\n".join(content_text(m.get("content")) for m in messages
                       if isinstance(m, dict) and m.get("role", "user") == "user")


def environment_class(name: str, url: str, *, timeout_s: float = 300.0) -> type[GymserveEnvironment]:
    """A GymserveEnvironment subclass with one typed method per tool of the server at `url`."""
    reply = httpx.get(f"{url.rstrip('/')}/openapi.json", headers=auth_headers(), timeout=60)
    reply.raise_for_status()
    members: dict[str, Any] = {"url": url.rstrip("/"), "environment": name, "timeout_s": timeout_s,
                               "__doc__": f"gymserve environment {name!r} at {url}"}
    for tool, description, schema in tool_specs(reply.json()):
        if tool in members or tool.startswith("_") or hasattr(GymserveEnvironment, tool):
            raise ValueError(f"{name}: tool {tool!r} collides with an environment method")
        members[tool] = _tool_method(tool, description, schema)
    class_name = "".join(part.capitalize() for part in name.replace("-", "_").split("_")) + "Environment"
    return type(class_name, (GymserveEnvironment,), members)


def environments(names: Iterable[str] | dict[str, str], *, head_url: str | None = None,
                 timeout_s: float = 300.0) -> dict[str, type[GymserveEnvironment]]:
    """`{environment: factory}` for TRL's `environment_factory` (a class is its own factory).
    `names` are resource servers resolved through the head, or a `{name: url}` mapping."""
    if isinstance(names, dict):
        urls = dict(names)
    else:
        if not head_url:
            raise ValueError("environments: pass head_url to resolve resource servers by name, or {name: url}")
        directory = Directory(head_url, via_head="auto")
        urls = {name: run_sync(lambda n=name: directory.url(n)) for name in names}  # type: ignore[misc]
    return {name: environment_class(name, url, timeout_s=timeout_s) for name, url in urls.items()}


def completion_recorder(completions: list[Any], environments: list[GymserveEnvironment] | None = None,
                        **_: Any) -> list[None]:
    """A TRL reward function that only hands each rollout's final completion to its environment
    (TRL calls it before the environments' `get_reward`); it scores nothing (None)."""
    for completion, env in zip(completions, environments or []):
        if isinstance(env, GymserveEnvironment):
            env._record_completion(completion)
    return [None] * len(completions)


def environment_dataset(rows: Iterable[dict[str, Any]], environment_of: Callable[[dict[str, Any]], str]):
    """A `datasets.Dataset` for TRL: `prompt` (the row's system messages and an empty user turn that
    `reset` fills with the user text), `environment`, and the row as JSON."""
    import datasets

    items = []
    for row in rows:
        params = row.get("responses_create_params") or {}
        messages = params.get("input") if isinstance(params.get("input"), list) else []
        system = [{"role": m.get("role"), "content": content_text(m.get("content"))} for m in messages
                  if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        if params.get("instructions"):
            system.insert(0, {"role": "system", "content": params["instructions"]})
        items.append({"prompt": [*system, {"role": "user", "content": ""}], ENV_COLUMN: environment_of(row),
                      ROW_COLUMN: json.dumps(row, ensure_ascii=False)})
    return datasets.Dataset.from_list(items)


def tool_chat_template(tokenizer: Any) -> Any:
    """TRL parses tool calls only for chat templates it knows. A ChatML tokenizer whose template it
    does not know (the embedded SmolLM2's) gets TRL's Qwen2.5 template, the same ChatML turns plus
    Hermes `<tool_call>` blocks."""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    try:
        return add_response_schema(tokenizer)
    except ValueError:
        if "<|im_start|>" not in tokenizer.get_vocab():
            raise
    log.info("environment_factory: using TRL's Qwen2.5 chat template for tool calls")
    tokenizer.chat_template = qwen2_5_chat_template
    return add_response_schema(tokenizer)


def environment_inputs(config: Any, head_url: str, train_rows: list[dict[str, Any]],
                       eval_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """GRPOTrainer arguments for `mode: environment_factory`: factories for every environment the rows
    name (a row's `environment`, else the config's), the datasets and the completion recorder."""
    def environment_of(row: dict[str, Any]) -> str:
        name = row.get(ENV_COLUMN) or config.environment
        if not name:
            raise ValueError("mode environment_factory: a row has no `environment` field and the config sets "
                             "no `environment` (the resource server that serves the row)")
        return str(name)

    names = sorted({environment_of(row) for row in [*train_rows, *eval_rows]})
    return {"environment_factory": environments(names, head_url=head_url),
            "reward_funcs": [completion_recorder],
            "train_dataset": environment_dataset(train_rows, environment_of),
            "eval_dataset": environment_dataset(eval_rows, environment_of) if eval_rows else None}
