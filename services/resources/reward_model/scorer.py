"""The Hugging Face backend: load a sequence-classification reward model and score padded batches.

reward = the single logit of the classification head at the conversation's last real
token. Decoder reward models (`*ForSequenceClassification` with a `score` head: Llama,
Qwen, Mistral, Gemma, GPT-2 ...) are run as base model + head, pooling the hidden state
at the last position the attention mask marks as real, so padding (left or right) never
changes a score and a pad token equal to EOS cannot shift the pooled position (HF's own
pooling looks for the pad token id). Other models (encoders pooling their CLS token) are
called as-is with an attention mask.
"""
from __future__ import annotations

import gc
import logging
from typing import Any, Literal

from services.core.errors import GymError
from services.core.failures import FailureKind

log = logging.getLogger("gymserve.reward_model")

PRECISIONS = ("bfloat16", "float16", "float32")


class ScoringError(GymError):
    """Inference failed (e.g. out of memory on a single sequence): the sample is masked, not scored 0."""

    status_code = 503
    error_type = "scoring_failed"
    kind = FailureKind.CRASH


def resolve_devices(spec: str | None) -> list[str]:
    """`None` -> cuda:0 if available else cpu; "cpu"; "cuda"; "cuda:1"; GPU ids "0,1" -> cuda:0, cuda:1."""
    import torch

    if spec is None or spec == "" or spec == "auto":
        return ["cuda:0"] if torch.cuda.is_available() else ["cpu"]
    spec = str(spec).strip()
    if spec == "cpu":
        return ["cpu"]
    if spec == "cuda":
        return ["cuda:0"]
    devices = []
    for part in spec.split(","):
        part = part.strip()
        if part.startswith("cuda:"):
            part = part[5:]
        devices.append(f"cuda:{int(part)}")
    return devices


def resolve_dtype(precision: str, device: str) -> Any:
    import torch

    if precision == "auto":
        precision = "float32" if device == "cpu" else "bfloat16"
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[precision]


def is_oom(exc: BaseException) -> bool:
    import torch

    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def load_tokenizer(name: str, *, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name, trust_remote_code=trust_remote_code)
    if tokenizer.pad_token_id is None:  # padding only; pooling never looks at the pad id
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return tokenizer


def skip_cudnn_attention(device: str) -> None:
    """On a GPU, let attention use PyTorch's flash and memory-efficient kernels, not cuDNN's. cuDNN
    builds an execution plan for every new (batch size, length) shape, on the CPU, and a dynamic
    batcher makes nearly every batch a new shape: on an H200 a fresh batch of 32 took 93 ms that
    way against 7.7 ms with the memory-efficient kernel (6.7 ms either way for shapes seen before).
    Process-wide: the reward model server is the process's only model user."""
    import torch

    if device != "cpu" and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


class HFScorer:
    """One model replica on one device. `score` is called from that replica's single inference thread."""

    def __init__(self, model: Any, device: str, *, pad_id: int, padding_side: Literal["left", "right"]) -> None:
        import torch

        self.model = model
        self.device = torch.device(device)
        self.pad_id = pad_id
        self.padding_side = padding_side
        head = getattr(model, "score", None)
        base = getattr(model, getattr(model, "base_model_prefix", ""), None)
        self.fast = isinstance(head, torch.nn.Linear) and isinstance(base, torch.nn.Module) and base is not model
        self.head = head if self.fast else None
        self.base = base if self.fast else None
        self.oom_splits = 0

    @classmethod
    def load(cls, model_name: str, device: str, *, precision: str, pad_id: int,
             padding_side: Literal["left", "right"], trust_remote_code: bool = False) -> "HFScorer":
        import torch
        from transformers import AutoModelForSequenceClassification

        dtype = resolve_dtype(precision, device)
        model = AutoModelForSequenceClassification.from_pretrained(model_name, dtype=dtype,
                                                                   trust_remote_code=trust_remote_code)
        num_labels = getattr(model.config, "num_labels", 1)
        if num_labels != 1:
            raise ValueError(f"model_name={model_name}: a reward model has a single output logit "
                             f"(num_labels=1), this one has num_labels={num_labels}")
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = pad_id  # HF refuses batches > 1 without one (fallback path)
        skip_cudnn_attention(device)
        model.to(torch.device(device)).eval()
        scorer = cls(model, device, pad_id=pad_id, padding_side=padding_side)
        scorer.score([[pad_id, pad_id]])  # warm-up: first-call kernel setup off the request path
        return scorer

    # ------------------------------------------------------------------ #
    def score(self, batch: list[list[int]]) -> list[float | ScoringError]:
        """Scores in batch order. On out-of-memory the batch is split in halves and retried; a single
        sequence that still does not fit gets a ScoringError in its place (the others are scored)."""
        try:
            return list(self.forward(batch))
        except Exception as exc:
            if not is_oom(exc):
                raise
            self._free_cache()
            if len(batch) == 1:
                return [ScoringError(f"out of memory scoring one sequence of {len(batch[0])} tokens on "
                                     f"{self.device}; lower max_model_len or use more GPUs")]
            self.oom_splits += 1
            mid = len(batch) // 2
            log.warning("out of memory on a batch of %d sequences: splitting", len(batch))
            return self.score(batch[:mid]) + self.score(batch[mid:])

    def forward(self, batch: list[list[int]]) -> list[float]:
        import torch

        lengths = [len(seq) for seq in batch]
        width = max(lengths)
        if self.padding_side == "right":
            rows = [seq + [self.pad_id] * (width - len(seq)) for seq in batch]
            masks = [[1] * n + [0] * (width - n) for n in lengths]
            last = [n - 1 for n in lengths]
        else:
            rows = [[self.pad_id] * (width - len(seq)) + seq for seq in batch]
            masks = [[0] * (width - n) + [1] * n for n in lengths]
            last = [width - 1] * len(batch)
        input_ids = torch.tensor(rows, dtype=torch.long, device=self.device)
        attention_mask = torch.tensor(masks, dtype=torch.long, device=self.device)
        with torch.inference_mode():
            if self.fast:
                position_ids = None
                if self.padding_side == "left" and min(lengths) != width:
                    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
                out = self.base(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                use_cache=False)
                hidden = out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]
                index = torch.tensor(last, dtype=torch.long, device=self.device)
                pooled = hidden[torch.arange(len(batch), device=self.device), index]
                logits = self.head(pooled)
            else:
                logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits
            return logits[:, 0].float().cpu().tolist()

    def _free_cache(self) -> None:
        import torch

        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def close(self) -> None:
        """Free the replica's memory (model dropped, caches emptied)."""
        self.model = self.base = self.head = None
        self._free_cache()
