"""Start, talk to and stop the vLLM server behind models/vllm; push weights through vLLM's own API.

A weight push (`POST /v1/weights` on models/vllm) is, against vLLM's endpoints (on with
`VLLM_SERVER_DEV_MODE=1`): `/pause` (in-flight requests finish first) -> `/collective_rpc`
`gymserve_reload_weights` (vLLM's in-place `reload_weights` from a checkpoint folder, plus the
tied-head fix in worker_ext.py) -> `/reset_prefix_cache` (cached KV was computed with the old
weights) -> `/update_weight_version` -> `/resume`. The trainer's file is linked into a fresh
folder as `model.safetensors` because vLLM reloads from a folder, never copied.
"""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from services.core.errors import BadRequest, Conflict, GymError
from services.core.ports import free_port

from .process import VLLMProcess
from .venv import python_of, vllm_venv

if TYPE_CHECKING:
    from .app import Config

log = logging.getLogger("gymserve.models.vllm")
REPO_ROOT = Path(__file__).resolve().parents[3]
EXTENSION = "services.models.vllm.worker_ext.GymserveWorkerExtension"
ENV_PASS = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "HF_HOME", "HF_HUB_OFFLINE", "CUDA_VISIBLE_DEVICES",
            "GYMSERVE_CACHE_DIR", "TORCH_HOME")


def model_folder(model: str | None) -> Path:
    """A local HF folder, or the embedded SmolLM2-135M-Instruct converted once into the cache."""
    if model in (None, "", "embedded"):
        from ..hf.embedded import embedded_model_dir

        return embedded_model_dir()
    folder = Path(str(model)).expanduser()
    if not (folder / "config.json").exists():
        raise RuntimeError(f"model: {folder} is not a local Hugging Face model folder (no config.json); "
                           "models/vllm serves local folders only")
    return folder


class VLLMServer:
    """The vLLM child of one models/vllm server, plus its weight version."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.process: VLLMProcess | None = None
        self.model_dir: Path | None = None
        self.served_name = config.served_model_name or ""
        self.weights_version = 0
        self.pushes = 0
        self._push_lock = asyncio.Lock()
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        assert self.process is not None
        return self.process.url + "/v1"

    @property
    def key(self) -> str:
        assert self.process is not None
        return self.process.key

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.alive

    def command(self, folder: Path, port: int) -> list[str]:
        config = self.config
        base = list(config.vllm_command) if config.vllm_command else [
            str(python_of(vllm_venv(log))), "-m", "vllm.entrypoints.openai.api_server"]
        names = [self.served_name] + ([config.name] if config.name and config.name != self.served_name else [])
        return [*base, "--model", str(folder), "--served-model-name", *names, "--host", "127.0.0.1",
                "--port", str(port), "--max-model-len", str(config.max_model_len),
                "--max-num-batched-tokens", str(config.max_num_batched_tokens or config.max_model_len),
                "--max-num-seqs", str(config.max_num_seqs), "--dtype", config.dtype,
                "--logprobs-mode", "processed_logprobs", "--worker-extension-cls", EXTENSION,
                "--generation-config", "vllm", *(["--enforce-eager"] if config.enforce_eager else []),
                *config.vllm_args]

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k in ENV_PASS}
        env["PYTHONPATH"] = str(REPO_ROOT)  # the worker extension; it imports only torch and vLLM
        env["PYTHONUNBUFFERED"] = "1"
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(self.config.cpu_kv_cache_gb)))
        env.setdefault("HF_HUB_OFFLINE", "1")
        env["VLLM_NO_USAGE_STATS"] = "1"
        env["DO_NOT_TRACK"] = "1"
        if self.config.cpu_threads:
            env["OMP_NUM_THREADS"] = str(self.config.cpu_threads)
        if self.config.accept_weights:
            env["VLLM_SERVER_DEV_MODE"] = "1"  # /pause, /collective_rpc, ...: only the loopback front calls them
        return env

    async def start(self) -> None:
        self.model_dir = await asyncio.to_thread(model_folder, self.config.model)
        if not self.served_name:
            self.served_name = "SmolLM2-135M-Instruct" if self.config.model in (None, "", "embedded") \
                else self.model_dir.name
        if not self.config.vllm_command:
            await asyncio.to_thread(vllm_venv, log)
        port = free_port("127.0.0.1")
        self.process = VLLMProcess(self.command(self.model_dir, port), self.environment(), port)
        if self.config.vllm_api_key:
            self.process.key = self.config.vllm_api_key
        await self.process.start(self.config.start_timeout_s)
        log.warning("models/vllm: %s served by vLLM on %s", self.served_name, self.process.url)
        self._watch = asyncio.create_task(self._exit_with_vllm())

    async def _exit_with_vllm(self) -> None:
        """vLLM died (its engine crashed): stop this server too, so its supervisor restarts both."""
        assert self.process is not None and self.process.proc is not None
        code = await self.process.proc.wait()
        if not self._stopping:
            log.error("vLLM exited with code %s; stopping this server so it is restarted", code)
            os.kill(os.getpid(), signal.SIGTERM)

    async def stop(self) -> None:
        self._stopping = True
        if self.process is not None:
            await self.process.stop()

    async def _post(self, client: httpx.AsyncClient, path: str, **kwargs: Any) -> Any:
        assert self.process is not None
        response = await client.post(f"{self.process.url}{path}", headers={"Authorization": f"Bearer {self.key}"},
                                     **kwargs)
        if response.status_code >= 400:
            raise GymError(f"vLLM {path} answered {response.status_code}: {response.text[:500]}", status_code=502)
        return response.json() if response.content else None

    async def push_weights(self, path: str, version: int) -> int:
        """Load the safetensors file at `path` into vLLM and make `version` its weights version."""
        source = Path(path)
        if not source.is_file():
            raise BadRequest(f"path: {path} is not a file on this host")
        async with self._push_lock:
            if version <= self.weights_version:
                raise Conflict(f"version: {version} is not newer than the server's weights_version "
                               f"{self.weights_version}")
            folder = Path(tempfile.mkdtemp(prefix="gymserve-vllm-weights-", dir=source.parent))
            try:
                try:
                    os.link(source, folder / "model.safetensors")
                except OSError:
                    os.symlink(source.resolve(), folder / "model.safetensors")
                await self._reload(str(folder), version)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            self.weights_version = version
            self.pushes += 1
            return version

    async def _reload(self, folder: str, version: int) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=self.config.start_timeout_s) as client:
            await self._post(client, "/pause", params={"mode": "wait"})
            try:
                await self._post(client, "/collective_rpc", json={
                    "method": "gymserve_reload_weights", "kwargs": {"weights_path": folder}})
                await self._post(client, "/reset_prefix_cache")
                await self._post(client, "/update_weight_version", json={"new_version": str(version)})
            finally:
                await self._post(client, "/resume")
