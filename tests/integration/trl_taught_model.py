"""A tiny model taught to call one tool per environment inside TRL's own environment_factory
generation, token for token as GRPOTrainer renders and concatenates it.

TRL 1.16 renders each rollout's prompt with its environment's tool methods
(`_tokenize_prompts`: `apply_chat_template(..., tools=..., add_generation_prompt=True)` with the
text of `reset()` appended to the last user turn), parses the generated ids with the tokenizer's
response schema (`parse_response`), calls the tool, and continues from
`prompt_ids + completion_ids + _get_tool_suffix_ids(tool messages)` without re-tokenising.
Each lesson teaches both model turns on exactly those ids: the tool call, then the answer after
the real tool output (called here on the real server, so the taught context is what training sees).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from services.models.hf.templates import format_tool_call

CONTEXT = 4096  # the workplace prompt (19 tool schemas) is about 3,200 tokens


@dataclass(frozen=True)
class Lesson:
    environment: str
    row: dict[str, Any]
    tool: str
    arguments: dict[str, Any]
    answer: str


def tool_tokenizer() -> Any:
    """The embedded tokenizer as `gymserve train` hands it to TRL (its ChatML template swapped for
    TRL's Qwen2.5 one, which TRL parses tool calls for)."""
    from transformers import AutoTokenizer

    from services.models.hf.embedded import embedded_model_dir
    from trainer.environment_factory import tool_chat_template

    return tool_chat_template(AutoTokenizer.from_pretrained(str(embedded_model_dir())))


def _tools(env: Any) -> list[Any]:
    """The methods TRL exposes as tools (GRPOTrainer.__init__: public functions but reset/get_reward)."""
    return [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def _training_template(tokenizer: Any) -> str | None:
    """The template GRPOTrainer renders with when tools are on (its __init__: a prefix-preserving one)."""
    from trl.chat_template_utils import get_training_chat_template, is_chat_template_prefix_preserving

    return None if is_chat_template_prefix_preserving(tokenizer) else get_training_chat_template(tokenizer)


def _suffix_ids(tokenizer: Any, template: str | None, tool_messages: list[dict[str, Any]]) -> list[int]:
    """TRL's own `GRPOTrainer._get_tool_suffix_ids` (the ids of the tool turn and the next assistant header)."""
    from trl import GRPOTrainer

    trainer = SimpleNamespace(processing_class=tokenizer, _tokenizer=tokenizer, _is_vlm=False, chat_template=template,
                              chat_template_kwargs={})
    return GRPOTrainer._get_tool_suffix_ids(trainer, tool_messages)


def teach_pairs(factories: dict[str, Any], lessons: list[Lesson]) -> list[tuple[list[int], str]]:
    from trainer.environment_factory import environment_dataset

    tokenizer = tool_tokenizer()
    template = _training_template(tokenizer)
    pairs: list[tuple[list[int], str]] = []
    for lesson in lessons:
        env = factories[lesson.environment]()
        example = environment_dataset([lesson.row], lambda _, name=lesson.environment: name)[0]
        prompt = example["prompt"]
        observation = env.reset(**{k: v for k, v in example.items() if k != "environment"})
        prompt = prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}]
        prompt_ids = tokenizer.apply_chat_template(conversation=[prompt], tools=_tools(env), chat_template=template,
                                                   add_generation_prompt=True, tokenize=True,
                                                   return_dict=True)["input_ids"][0]
        call = format_tool_call(lesson.tool, lesson.arguments)
        output = getattr(env, lesson.tool)(**lesson.arguments)  # the real server's reply, as TRL will see it
        env._close()
        call_ids = tokenizer(call, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        suffix = _suffix_ids(tokenizer, template, [{"role": "tool", "name": lesson.tool, "content": str(output)}])
        pairs += [(list(prompt_ids), call), (list(prompt_ids) + call_ids + suffix, lesson.answer)]
    return pairs


def taught_environment_model(factories: dict[str, Any], lessons: list[Lesson]) -> Path:
    """The tiny model taught `lessons` (cached per rendered lesson)."""
    from services.models.hf.tiny import taught_tiny_model

    return taught_tiny_model("tiny-trl-env", teach_pairs(factories, lessons), context=CONTEXT, layers=1)

