"""The environment each child of `gymserve up` gets: a small fixed base set plus the variables its
own spec references (`${VAR}`), never the launcher's whole environment (which may hold
unrelated secrets: cloud credentials, tokens of other tools)."""
from __future__ import annotations

import os
import re
from typing import Any, Mapping

# what Python, the libraries and the GPU stack need to run at all
BASE_NAMES = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TZ", "USER", "LOGNAME", "SHELL", "TERM", "TMPDIR",
                        "PYTHONPATH", "VIRTUAL_ENV", "LD_LIBRARY_PATH", "XDG_CONFIG_HOME", "XDG_CACHE_HOME",
                        "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "OMP_NUM_THREADS",
                        "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM"})
BASE_PREFIXES = ("GYMSERVE_", "LC_", "CUDA_", "NVIDIA_", "HF_", "TRANSFORMERS_", "TORCH_")
_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-[^}]*)?\}")


def referenced(value: Any) -> set[str]:
    """Names of the `${VAR}` / `${VAR:-default}` references anywhere in a spec."""
    if isinstance(value, str):
        return set(_REFERENCE.findall(value))
    if isinstance(value, dict):
        return set().union(*(referenced(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(referenced(v) for v in value)) if value else set()
    return set()


def child_env(spec: Any, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The base set plus what `spec` references, from `environ` (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    wanted = referenced(spec)
    return {k: v for k, v in environ.items()
            if k in BASE_NAMES or k.startswith(BASE_PREFIXES) or k in wanted}
