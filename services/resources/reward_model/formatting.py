"""Conversations -> token ids, the way NeMo RL's reward model environment builds them.

NeMo RL (`get_formatted_message_log(..., add_bos_token=True, add_eos_token=True,
add_generation_prompt=False)`) renders the messages with the tokenizer's chat template
and no generation prompt, adds BOS when the text does not start with it, adds EOS when
the text (trailing newlines ignored) does not end with it, drops the empty
`<think></think>` block some templates insert, and tokenizes without special tokens.
We do the same on the whole text at once (NeMo tokenizes message by message; the
ids are the same whenever messages are separated by special tokens, as in every chat
template). Conversations longer than `max_model_len` are truncated and flagged.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from services.core.content import strict_content_text
from services.core.errors import BadRequest
from services.core.schemas import VerifyRequest

_EMPTY_THINK = "\n<think>\n\n</think>\n"


@dataclass(frozen=True)
class Encoded:
    """One scoring input: the ids the model sees, the untruncated length, and the truncation flag."""

    ids: list[int]
    num_tokens: int
    truncated: bool


def validate_conversation(conversation: Any, where: str) -> list[dict[str, Any]]:
    """A list of `{role, content}` messages, checked; the error names the conversation and message."""
    if not isinstance(conversation, list):
        raise BadRequest(f"{where}: expected a list of messages, got {type(conversation).__name__}")
    if not conversation:
        raise BadRequest(f"{where}: empty conversation (expected at least one message)")
    messages = []
    for j, message in enumerate(conversation):
        here = f"{where}[{j}]"
        if not isinstance(message, dict):
            raise BadRequest(f"{here}: expected an object with role and content, got {type(message).__name__}")
        role = message.get("role")
        if not isinstance(role, str) or not role.strip():
            raise BadRequest(f"{here}.role: missing or not a non-empty string")
        messages.append({**message, "role": role, "content": strict_content_text(message.get("content"), here)})
    return messages


def rollout_messages(request: VerifyRequest) -> list[dict[str, Any]]:
    """The conversation a rollout is judged on: the row's prompt messages + the assistant's reply text."""
    params = request.responses_create_params
    messages: list[dict[str, Any]] = []
    if params.instructions:
        messages.append({"role": "system", "content": params.instructions})
    for i, item in enumerate(params.input_messages()):
        where = f"responses_create_params.input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: expected a message object")
        if item.get("type", "message") != "message":
            continue  # tool calls/outputs in the prompt: not part of the judged conversation
        role = item.get("role")
        if not isinstance(role, str) or not role:
            raise BadRequest(f"{where}.role: missing or not a string")
        messages.append({"role": "system" if role == "developer" else role,
                         "content": strict_content_text(item.get("content"), where)})
    messages.append({"role": "assistant", "content": request.text()})
    return messages


class Encoder:
    """Tokenizes conversations and formatted texts for the reward model (thread-safe, no state)."""

    def __init__(self, tokenizer: Any, *, max_model_len: int, truncation_side: Literal["left", "right"] = "left",
                 chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.truncation_side = truncation_side
        self.chat_template = chat_template
        self.bos = tokenizer.bos_token
        self.eos = tokenizer.eos_token
        self.bos_id = tokenizer.bos_token_id
        self.pad = tokenizer.pad_token

    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template or getattr(self.tokenizer, "chat_template", None))

    def format_conversation(self, messages: list[dict[str, Any]], where: str = "conversation") -> str:
        if not self.has_chat_template:
            raise BadRequest("the reward model's tokenizer has no chat template: set the chat_template option, "
                             "or send formatted texts to /get_reward")
        try:
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False,
                                                      chat_template=self.chat_template)
        except Exception as exc:  # jinja raise_exception (e.g. roles must alternate), unknown roles
            raise BadRequest(f"{where}: the chat template rejected the conversation: {exc}") from None
        if not isinstance(text, str):
            raise BadRequest(f"{where}: the chat template did not render to text")
        if not any("<think>" in m["content"] for m in messages):
            text = text.replace(_EMPTY_THINK, "")
        return text

    def add_special(self, text: str) -> str:
        """BOS if missing at the start, EOS if missing at the end (NeMo RL's add_bos/add_eos)."""
        if self.bos and not text.startswith(self.bos):
            text = self.bos + text
        if self.eos and not text.rstrip("\n").endswith(self.eos):
            text = text + self.eos
        return text

    def encode_text(self, text: str, where: str = "text") -> Encoded:
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        if not ids:
            raise BadRequest(f"{where}: tokenizes to zero tokens")
        return self.truncate(ids)

    def truncate(self, ids: list[int]) -> Encoded:
        n, limit = len(ids), self.max_model_len
        if n <= limit:
            return Encoded(ids, n, False)
        if self.truncation_side == "right":
            return Encoded(ids[:limit], n, True)
        # keep the end (the response and the pooled last token); keep a leading BOS too
        if self.bos_id is not None and ids[0] == self.bos_id and limit > 1:
            return Encoded([ids[0]] + ids[n - limit + 1:], n, True)
        return Encoded(ids[n - limit:], n, True)

    def encode_conversation(self, messages: list[dict[str, Any]], where: str = "conversation") -> Encoded:
        return self.encode_text(self.add_special(self.format_conversation(messages, where)), where)

    def encode_query(self, query: str, where: str = "query") -> Encoded:
        """An OpenRLHF query (a formatted prompt+response, maybe padded): pads stripped, BOS/EOS as above."""
        if self.pad:
            while query.startswith(self.pad):
                query = query[len(self.pad):]
            while query.endswith(self.pad):
                query = query[: -len(self.pad)]
        return self.encode_text(self.add_special(query), where)
