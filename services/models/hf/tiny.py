"""A tiny local model for fast tests: a 2-layer Llama with the embedded model's tokenizer and template.

`make_tiny_model(folder)` writes a randomly initialised model folder (seconds on CPU).
With `teach=[(prompt, reply_text), ...]` it is first overfitted on those pairs so it
really emits them (for example a `<tool_call>` block), which lets tests exercise tool-call
parsing and multi-turn tool conversations end to end with a real model. A prompt is text,
or token ids where the exact tokens matter (a trainer that concatenates ids across turns).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Sequence

Prompt = str | list[int]


def make_tiny_model(folder: str | Path, *, teach: Sequence[tuple[Prompt, str]] = (), steps: int = 300,
                    seed: int = 0, hidden: int = 64, layers: int = 2, context: int = 2048) -> Path:
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from .embedded import embedded_model_dir

    folder = Path(folder)
    source = embedded_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(str(source))
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 2,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    if teach:
        used = _overfit(model, tokenizer, list(teach), steps)
        if used >= steps:
            raise RuntimeError(f"the tiny model did not learn its {len(teach)} replies in {steps} steps")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    if (source / "chat_template.jinja").exists() and not (tmp / "chat_template.jinja").exists():
        shutil.copy(source / "chat_template.jinja", tmp / "chat_template.jinja")
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def _rows(tokenizer: Any, pairs: list[tuple[Prompt, str]]) -> list[tuple[list[int], list[int]]]:
    """(ids, labels) per pair, loss only on the reply (+ end of turn). A row whose whole sequence
    starts another row's prompt (an earlier turn of the same conversation) is folded into that
    row: the same predictions from the same contexts, without running the shared prefix twice."""
    eos = tokenizer.eos_token_id
    rows = []
    for prompt, reply in pairs:
        p = list(prompt) if isinstance(prompt, list) else tokenizer(prompt, add_special_tokens=False).input_ids
        r = tokenizer(reply, add_special_tokens=False).input_ids + [eos]
        rows.append((p + r, [-100] * len(p) + r))
    rows.sort(key=lambda row: len(row[0]), reverse=True)
    kept: list[tuple[list[int], list[int]]] = []
    for ids, labels in rows:
        host = next((k for k in kept if k[0][:len(ids)] == ids), None)
        if host is None:
            kept.append((ids, labels))
            continue
        for i, label in enumerate(labels):
            if label != -100:
                host[1][i] = label
    return kept


def _overfit(model, tokenizer, pairs: list[tuple[Prompt, str]], steps: int) -> int:
    """Teach the model to answer each prompt with its reply; loss only on the reply positions,
    each row run on its own (no padding: a long prompt does not make the short ones pay for it)."""
    import torch

    rows = []
    for ids, labels in _rows(tokenizer, pairs):
        targets = torch.tensor(labels[1:])
        rows.append((torch.tensor([ids]), targets, targets != -100))
    total = sum(int(keep.sum()) for _, _, keep in rows)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # far faster than 2 contending threads on a busy small machine
    model.train()
    for step in range(steps):  # noqa: B007 (the count is returned)
        loss_sum, right = 0.0, True
        for ids, targets, keep in rows:
            # only the reply positions go through the (large) output layer
            logits = model.lm_head(model.model(input_ids=ids).last_hidden_state[0, :-1][keep])
            loss = torch.nn.functional.cross_entropy(logits, targets[keep], reduction="sum") / total
            loss.backward()
            loss_sum += loss.item()
            right = right and bool((logits.argmax(-1) == targets[keep]).all())
        optim.step()
        optim.zero_grad()
        if right and loss_sum < 0.1 and _learned(model, rows):
            break
    torch.set_num_threads(threads)
    model.eval()
    return step + 1


def _learned(model, rows: list[tuple[Any, Any, Any]]) -> bool:
    """Each reply token is the greedy choice with a clear margin, in eval mode (the generation
    setting): generation must not drift off a reply whose logits win by a hair."""
    import torch

    model.eval()
    try:
        with torch.no_grad():
            for ids, targets, keep in rows:
                top2 = model.lm_head(model.model(input_ids=ids).last_hidden_state[0, :-1][keep]).topk(2, dim=-1)
                if not bool((top2.indices[:, 0] == targets[keep]).all()):
                    return False
                if float((top2.values[:, 0] - top2.values[:, 1]).min()) < 1.0:
                    return False
        return True
    finally:
        model.train()


# A tool-using conversation the tiny test model is taught: call get_weather, then answer.
WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
WEATHER_QUESTION = "What is the weather in Paris?"
WEATHER_CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
WEATHER_RESULT = '{"weather": "sunny"}'
WEATHER_ANSWER = "It is sunny in Paris."


def weather_messages(turn: int) -> list[dict]:
    """The conversation before model call `turn` (0: the question; 1: after the tool result)."""
    import json

    messages: list[dict] = [{"role": "user", "content": WEATHER_QUESTION}]
    if turn >= 1:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": WEATHER_CALL["name"], "arguments": json.dumps(WEATHER_CALL["arguments"])}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": WEATHER_RESULT}]
    return messages


def tiny_tool_model(root: str | Path | None = None) -> Path:
    """The tiny model taught the weather conversation, cached (built once, ~100 training steps)."""
    from transformers import AutoTokenizer

    from .embedded import embedded_model_dir
    from .templates import ChatFormat, format_tool_call

    fmt = ChatFormat(AutoTokenizer.from_pretrained(str(embedded_model_dir())))
    teach = [(fmt.render(weather_messages(0), WEATHER_TOOLS),
              format_tool_call(WEATHER_CALL["name"], WEATHER_CALL["arguments"])),
             (fmt.render(weather_messages(1), WEATHER_TOOLS), WEATHER_ANSWER)]
    return _cached("tiny-weather", ["v2", teach], teach, root)  # v2: margin-checked teaching


# A code task solved in tool mode: run a program with the code environment's tool, then answer.
EXECUTE_PYTHON = {  # Responses API shape, as an agent row offers it
    "type": "function", "name": "execute_python",
    "description": "Run Python code in a persistent sandboxed interpreter and return its stdout/stderr.",
    "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python source"}},
                   "required": ["code"], "additionalProperties": False},
}
CODE_SYSTEM = "You can run Python with the execute_python tool before answering."
CODE_CALL = {"name": "execute_python", "arguments": {"code": "print(2 + 3)"}}
CODE_STDOUT = "5\n"
# The tool's reply as the code environment sends it from a bubblewrap sandbox; after another
# reply (another sandbox mode) the model's answer is not taught.
CODE_RESULT = ('{"stdout":"5\\n","stderr":"","exit_code":0,"timed_out":false,"result":null,"truncated":false,'
               '"terminated":false,"sandbox":"bwrap"}')
CODE_ANSWER = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"


def code_messages(task: list[dict], turn: int) -> list[dict]:
    """Chat messages before model call `turn` of the code conversation on `task` (the row's input)."""
    import json

    messages: list[dict] = [{"role": "system", "content": CODE_SYSTEM}, *task]
    if turn >= 1:
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                "name": CODE_CALL["name"], "arguments": json.dumps(CODE_CALL["arguments"])}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": CODE_RESULT}]
    return messages


def tiny_code_model(task: list[dict], root: str | Path | None = None) -> Path:
    """The tiny model taught to call `execute_python` on `task` (a row's input messages), then answer
    with CODE_ANSWER; cached per task."""
    from transformers import AutoTokenizer

    from ..openai_api import chat_tools
    from .embedded import embedded_model_dir
    from .templates import ChatFormat, format_tool_call

    fmt = ChatFormat(AutoTokenizer.from_pretrained(str(embedded_model_dir())))
    tools = chat_tools([EXECUTE_PYTHON])  # what the server makes of the row's tools
    teach = [(fmt.render(code_messages(task, 0), tools), format_tool_call(CODE_CALL["name"], CODE_CALL["arguments"])),
             (fmt.render(code_messages(task, 1), tools), CODE_ANSWER)]
    return _cached("tiny-code", ["v1", teach], teach, root)


def taught_tiny_model(name: str, teach: Sequence[tuple[Prompt, str]], root: str | Path | None = None,
                      **options: Any) -> Path:
    """A tiny model taught `teach` (`make_tiny_model` options such as `context`), cached under
    `name` and a digest of the pairs and options."""
    return _cached(name, ["v1", options, list(teach)], list(teach), root, **options)


def _cached(name: str, key: object, teach: list[tuple[Prompt, str]], root: str | Path | None,
            **options: Any) -> Path:
    """The model taught `teach`, built once per `key` under the cache (a file lock keeps parallel
    test processes from building it twice)."""
    import fcntl
    import hashlib
    import json

    from .embedded import cache_root

    digest = hashlib.sha256(json.dumps(key).encode()).hexdigest()[:12]
    folder = Path(root or cache_root() / "models") / f"{name}-{digest}"
    if not (folder / "config.json").exists():
        folder.parent.mkdir(parents=True, exist_ok=True)
        with open(folder.parent / f".{folder.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "config.json").exists():
                make_tiny_model(folder, teach=teach, **options)
    return folder
