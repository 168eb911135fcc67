"""The transformers + PEFT engine: batched generation on one base model with several LoRA adapters.

One worker thread owns the model. It takes every waiting request (up to `max_batch`), decodes them
together step by step with a KV cache, and streams each step's tokens back to the asyncio side.
Requests for different adapters share a batch: PEFT's mixed-adapter forward applies each row's
adapter (`adapter_names`, "__base__" for the base model). Adapter loads and unloads run in the same
thread between two decoding steps, so a swap never races a forward pass and never waits for a
batch to finish.

This is the fallback engine (and the faster one on small CPU machines, see docs/serving.md).
It knows nothing about HTTP, chat templates or the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from online_rl.serving.engine import AdapterLoadError, Engine, EngineError, GenerationRequest, TokenDelta

__all__ = ["TransformersEngine"]

logger = logging.getLogger(__name__)
_BASE = "__base__"


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    out: asyncio.Queue[TokenDelta | BaseException]
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False
    generated: int = 0
    generator: Any = None
    done: bool = False

    def emit(self, item: TokenDelta | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)


@dataclass(eq=False)
class _Command:
    action: Callable[[], None]
    future: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop
    error: BaseException | None = field(default=None)


class TransformersEngine(Engine):
    """Batched, streaming generation with transformers and PEFT LoRA adapters."""

    name = "transformers"

    def __init__(
        self,
        model_dir: Path,
        *,
        max_batch: int = 16,
        max_model_len: int = 2048,
        max_loras: int = 4,
        batch_wait_s: float = 0.005,
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self._torch = torch
        self._model_dir = Path(model_dir)
        self._max_batch = max_batch
        self._max_len = max_model_len
        self._max_loras = max_loras
        self._batch_wait = batch_wait_s
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        base.eval()
        self._model: Any = base
        self._peft = False
        self._adapters: list[str] = []
        eos: set[int] = set()
        try:
            gen = GenerationConfig.from_pretrained(str(model_dir))
            ids = gen.eos_token_id
            eos.update([ids] if isinstance(ids, int) else list(ids or []))
        except OSError:
            pass
        if isinstance(base.config.eos_token_id, int):
            eos.add(base.config.eos_token_id)
        if not eos:
            raise EngineError(f"{model_dir} names no end-of-sequence token (config.json eos_token_id)")
        self._eos = frozenset(eos)
        pad = base.config.pad_token_id
        self._pad = int(pad) if isinstance(pad, int) else min(eos)
        self._inbox: queue.Queue[_Job | _Command | None] = queue.Queue()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="orl-hf-engine", daemon=True)
        self._thread.start()

    # -- the asyncio side ------------------------------------------------------------------------

    @property
    def max_model_len(self) -> int:
        return self._max_len

    def adapters(self) -> list[str]:
        return list(self._adapters)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[TokenDelta]:
        if self._stopped:
            raise EngineError("the engine is closed")
        if request.adapter is not None and request.adapter not in self._adapters:
            raise EngineError(f"adapter {request.adapter!r} is not loaded")
        job = _Job(request, asyncio.Queue(), asyncio.get_running_loop())
        self._inbox.put(job)
        try:
            while True:
                item = await job.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            job.cancelled = True  # a client that went away stops costing compute

    async def load_adapter(self, name: str, path: Path) -> None:
        if name in self._adapters:
            raise AdapterLoadError(f"an adapter named {name!r} is already loaded")
        if len(self._adapters) >= self._max_loras:
            raise AdapterLoadError(
                f"{len(self._adapters)} adapters are loaded, the most this engine holds "
                f"(inference.max_loras); unload one first"
            )
        await self._call(lambda: self._load(name, path))

    async def unload_adapter(self, name: str) -> None:
        if name not in self._adapters:
            raise AdapterLoadError(f"no adapter named {name!r} is loaded")
        await self._call(lambda: self._unload(name))

    async def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._inbox.put(None)
        await asyncio.to_thread(self._thread.join, 30)

    async def _call(self, action: Callable[[], None]) -> None:
        loop = asyncio.get_running_loop()
        command = _Command(action, loop.create_future(), loop)
        self._inbox.put(command)
        await command.future

    # -- the worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        pending: list[_Job] = []
        while True:
            if not pending:
                item = self._inbox.get()
                if item is None:
                    return
                if isinstance(item, _Command):
                    self._execute(item)
                    continue
                pending.append(item)
            pending = self._gather(pending)
            batch = [job for job in pending[: self._max_batch] if not job.cancelled]
            pending = pending[self._max_batch :]
            if self._stopped:
                for job in batch + pending:
                    job.emit(EngineError("the engine is shutting down; retry on another replica"))
                return
            if batch:
                try:
                    pending.extend(self._decode(batch))
                except Exception as exc:  # a failed batch fails its requests, never the engine
                    logger.exception("generation failed for %d requests", len(batch))
                    for job in batch:
                        if not job.done:
                            job.emit(EngineError(f"generation failed: {exc}"))

    def _gather(self, pending: list[_Job]) -> list[_Job]:
        """Wait `batch_wait_s` for more requests so that close arrivals share a batch."""
        deadline = self._batch_wait
        while len(pending) < self._max_batch:
            try:
                item = self._inbox.get(timeout=deadline) if deadline > 0 else self._inbox.get_nowait()
            except queue.Empty:
                break
            if item is None:
                self._inbox.put(None)
                break
            if isinstance(item, _Command):
                self._execute(item)
            else:
                pending.append(item)
            deadline = 0
        return pending

    def _poll_commands(self, keep: list[_Job]) -> None:
        """Between two decoding steps: run adapter commands, queue new requests for later."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is None:  # closing: finish this batch first
                self._inbox.put(None)
                return
            if isinstance(item, _Command):
                self._execute(item)
            else:
                keep.append(item)

    def _execute(self, command: _Command) -> None:
        error: BaseException | None = None
        try:
            # Commands may run between two decoding steps, inside inference mode; adapter weights
            # made there would be "inference tensors" that PEFT cannot manage later.
            with self._torch.inference_mode(False):
                command.action()
        except Exception as exc:
            error = exc if isinstance(exc, AdapterLoadError) else AdapterLoadError(str(exc))
        with contextlib.suppress(RuntimeError):
            command.loop.call_soon_threadsafe(_settle, command.future, error)

    def _load(self, name: str, path: Path) -> None:
        from peft import PeftModel

        try:
            if not self._peft:
                self._model = PeftModel.from_pretrained(self._model, str(path), adapter_name=name)
                self._peft = True
            else:
                self._model.load_adapter(str(path), adapter_name=name, is_trainable=False)
        except Exception as exc:
            self._discard(name)
            raise AdapterLoadError(f"PEFT could not load the adapter in {path}: {exc}") from exc
        self._model.eval()
        self._adapters.append(name)

    def _discard(self, name: str) -> None:
        """Remove what a failed load left behind, so that serving is unchanged."""
        if self._peft and name in self._model.peft_config:
            with contextlib.suppress(Exception):
                self._model.delete_adapter(name)

    def _unload(self, name: str) -> None:
        if len(self._adapters) == 1:
            self._model = self._model.unload()  # back to the plain base model
            self._peft = False
        else:
            # PEFT keeps one "active" adapter even though every forward here names its adapters;
            # move it off the one being deleted first, or PEFT looks up the deleted name later.
            if self._model.active_adapter == name:
                self._model.set_adapter(next(a for a in self._adapters if a != name), inference_mode=True)
            self._model.delete_adapter(name)
        self._adapters.remove(name)

    def _decode(self, jobs: list[_Job]) -> list[_Job]:
        """Decode `jobs` together until each has finished (or was cancelled); returns the
        requests that arrived meanwhile."""
        torch = self._torch
        for job in jobs:
            seed = job.request.sampling.seed
            job.generator = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
        prompts = [job.request.prompt_token_ids for job in jobs]
        width = max(len(p) for p in prompts)
        ids = torch.full((len(jobs), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):  # left padding: every row's next token is at the end
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        extra: dict[str, Any] = {}
        if self._peft:
            extra["adapter_names"] = [job.request.adapter or _BASE for job in jobs]
        budgets = [min(job.request.sampling.max_tokens, self._max_len - len(job.request.prompt_token_ids))
                   for job in jobs]
        cache: Any = None
        arrivals: list[_Job] = []
        with torch.inference_mode():
            while True:
                out = self._model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                  past_key_values=cache, use_cache=True, **extra)
                cache = out.past_key_values
                logits = out.logits[:, -1, :].float()
                tokens, logprobs = self._sample(jobs, logits)
                for row, job in enumerate(jobs):
                    if job.done:
                        continue
                    if job.cancelled:
                        job.done = True
                        continue
                    token = tokens[row]
                    job.generated += 1
                    reason = None
                    if token in self._eos:
                        reason = "stop"
                    elif job.generated >= budgets[row]:
                        reason = "length"
                    job.done = reason is not None
                    job.emit(TokenDelta([token], [logprobs[row]], reason))
                if all(job.done for job in jobs):
                    break
                self._poll_commands(arrivals)
                ids = torch.tensor(tokens, dtype=torch.long).unsqueeze(1)
                mask = torch.cat([mask, torch.ones((len(jobs), 1), dtype=torch.long)], dim=1)
                positions = positions[:, -1:] + 1
        return arrivals

    def _sample(self, jobs: list[_Job], logits: Any) -> tuple[list[int], list[float]]:
        torch = self._torch
        logp = torch.log_softmax(logits, dim=-1)
        chosen = logits.argmax(dim=-1)
        for row, job in enumerate(jobs):
            params = job.request.sampling
            if job.done or params.temperature == 0.0:
                continue
            probs = torch.softmax(logits[row] / params.temperature, dim=-1)
            if params.top_p < 1.0:
                ordered, order = probs.sort(descending=True)
                keep = ordered.cumsum(-1) - ordered < params.top_p  # always keeps the top token
                probs = torch.zeros_like(probs).scatter(0, order[keep], ordered[keep])
            chosen[row] = torch.multinomial(probs, 1, generator=job.generator)[0]
        token_list = [int(t) for t in chosen.tolist()]
        values = logp.gather(1, chosen.unsqueeze(1)).squeeze(1).tolist()
        return token_list, [float(v) for v in values]


def _settle(future: asyncio.Future[None], error: BaseException | None) -> None:
    if future.done():
        return
    if error is None:
        future.set_result(None)
    else:
        future.set_exception(error)
