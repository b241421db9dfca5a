"""A small random reward model built offline (no hub): for tests, benchmarks and smoke runs.

A real `LlamaForSequenceClassification(num_labels=1)` with a byte-level BPE tokenizer
trained on a few sentences and a ChatML chat template, saved with `save_pretrained`, so
it loads through exactly the same `from_pretrained` path as a hub reward model.
"""
from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<pad>", "<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]

_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "What is two plus two? Two plus two is four.",
    "A reward model scores a conversation between a user and an assistant.",
    "Please write a short poem about the sea and the sky.",
    "The capital of France is Paris, and the capital of Italy is Rome.",
    "Reinforcement learning from human feedback trains a policy against a learned reward.",
    "def add(a, b): return a + b  # numbers 0 1 2 3 4 5 6 7 8 9",
    "I am sorry, I cannot help with that request. Here is a helpful answer instead!",
]


def build_tiny_reward_model(path: str | Path, *, hidden_size: int = 64, num_layers: int = 2,
                            num_heads: int = 4, intermediate_size: int | None = None,
                            max_position_embeddings: int = 2048, vocab_size: int = 512,
                            seed: int = 0) -> Path:
    """Save a random reward model + tokenizer (pad != eos) under `path`; returns the path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForSequenceClassification, PreTrainedTokenizerFast

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    raw = Tokenizer(models.BPE(unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    raw.train_from_iterator(_CORPUS * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw, bos_token="<s>", eos_token="</s>", pad_token="<pad>", unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"], padding_side="right",
        model_max_length=max_position_embeddings,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():  # a random head of visible scale so scores differ clearly between inputs
        model.score.weight.normal_(0.0, hidden_size ** -0.5)
    model.eval()
    model.save_pretrained(out)
    return out


TINY_NAME = "tiny"  # `model_name: tiny`: this model, built once into the cache (the default stack's setting)


def cached_tiny_reward_model() -> Path:
    """The tiny reward model under `$GYMSERVE_CACHE_DIR/models`, built once (a lock serialises parallel starts)."""
    import fcntl
    import os
    import shutil
    import tempfile

    from services.models.hf.embedded import cache_root

    folder = cache_root() / "models" / "tiny-reward-model-v1"
    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with open(folder.parent / f".{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").exists():
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
            try:
                build_tiny_reward_model(tmp)
                os.rename(tmp, folder)  # atomic: readers see nothing or the whole folder
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
    return folder


if __name__ == "__main__":  # python -m services.resources.reward_model.tiny_model DIR
    import sys

    print(build_tiny_reward_model(sys.argv[1] if len(sys.argv) > 1 else "tiny-reward-model"))
