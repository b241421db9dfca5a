"""Chat templates and the Hermes/Qwen tool-call format.

Messages arrive in Chat Completions shape (the Responses converter produces the same).
Templates that know tools (Qwen, Hermes, Llama 3.x) get them through `tools=`; for
templates that ignore tools (SmolLM2's) we render them Hermes-style into the system
prompt, assistant tool calls as `<tool_call>` blocks and tool results as
`<tool_response>` user turns, which is what such models are fine-tuned on.
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from services.core.content import content_text

TOOL_CALL_RE = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
TOOL_CALL_OPEN = "<tool_call>"
DEFAULT_SYSTEM = "You are a helpful assistant."


def tools_system_prompt(tools: list[dict[str, Any]]) -> str:
    """The Hermes/Qwen2.5 tool instructions (function signatures inside <tools>)."""
    lines = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def format_tool_call(name: str, arguments: Any) -> str:
    args = _as_object(arguments)
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False) + "\n</tool_call>"


def _as_object(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, str]]]:
    """Split model output into (content, tool calls); calls are `{name, arguments (JSON string)}`.

    A block whose JSON does not parse stays in the content, so the caller sees what the model wrote.
    """
    if TOOL_CALL_OPEN not in text:
        return text, []
    calls: list[dict[str, str]] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL_RE.finditer(text):
        try:
            data = json.loads(match.group(1))
        except ValueError:
            continue
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            continue
        args = data.get("arguments", data.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                pass
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append({"name": data["name"],
                      "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)})
    kept.append(text[last:])
    return ("".join(kept).strip() if calls else text), calls


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChatFormat:
    """Renders chat messages (+ tools) into prompt text with the tokenizer's template."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        template = getattr(tokenizer, "chat_template", None) or ""
        if isinstance(template, dict):
            template = " ".join(str(v) for v in template.values())
        self.has_template = bool(template)
        self.native_tools = "tools" in template and "tool_call" in template

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = True) -> str:
        msgs = self._normalise(messages, tools)
        if not self.has_template:  # base models: plain transcript
            text = "".join(f"{m['role']}: {m.get('content') or ''}\n" for m in msgs)
            return text + ("assistant: " if add_generation_prompt else "")
        kwargs: dict[str, Any] = {}
        if tools and self.native_tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt,
                                                  **kwargs)

    def _normalise(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for msg in messages:
            role = msg.get("role")
            if role == "developer":
                role = "system"
            if self.native_tools:
                m: dict[str, Any] = {"role": role, "content": content_text(msg.get("content"))}
                if msg.get("tool_calls"):
                    m["tool_calls"] = [
                        {"type": "function", "id": c.get("id"),
                         "function": {"name": c["function"]["name"],
                                      "arguments": _as_object(c["function"].get("arguments", "{}"))}}
                        for c in msg["tool_calls"]]
                if role == "tool" and msg.get("tool_call_id"):
                    m["tool_call_id"] = msg["tool_call_id"]
                out.append(m)
                continue
            text = content_text(msg.get("content"))
            if role == "assistant" and msg.get("tool_calls"):
                blocks = [format_tool_call(c["function"]["name"], c["function"].get("arguments", "{}"))
                          for c in msg["tool_calls"]]
                text = "\n".join(([text] if text else []) + blocks)
            if role == "tool":
                block = f"<tool_response>\n{text}\n</tool_response>"
                if out and out[-1].get("_tool_turn"):
                    out[-1]["content"] += "\n" + block
                else:
                    out.append({"role": "user", "content": block, "_tool_turn": True})
                continue
            out.append({"role": role, "content": text})
        for m in out:
            m.pop("_tool_turn", None)
        if tools and not self.native_tools:
            prompt = tools_system_prompt(tools)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": (out[0]["content"] + "\n\n" + prompt).strip()}
            else:
                out.insert(0, {"role": "system", "content": DEFAULT_SYSTEM + "\n\n" + prompt})
        return out
