"""The transformers engine: batched generation on one base model with several LoRA adapters.

One worker thread owns the model and batches continuously: a new request is prefilled and merged
into the running batch (KV caches left-padded to a common length) at the next step, finished rows
leave it, and each step's tokens stream back to the asyncio side.
Requests for different adapters share a batch: `MultiLora` adds each row's adapter delta to the
targeted linear layers. An adapter is read from disk off the engine thread and installed by the
engine thread between two decoding steps (a few dict writes), so a swap never races a forward
pass, never waits for a batch to finish, and pauses decoding for well under a millisecond.

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
from collections import deque
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from online_rl.serving.engine import Engine, GenerationRequest, TokenDelta, check_room
from online_rl.serving.errors import AdapterLoadError, EngineError
from online_rl.serving.multi_lora import MultiLora

__all__ = ["TransformersEngine"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    request: GenerationRequest
    out: asyncio.Queue[TokenDelta | BaseException]
    loop: asyncio.AbstractEventLoop
    cancelled: bool = False
    generated: int = 0
    generator: Any = None
    budget: int = 0
    done: bool = False

    def emit(self, item: TokenDelta | BaseException) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self.loop.call_soon_threadsafe(self.out.put_nowait, item)


@dataclass(eq=False)
class _Running:
    """The batch being decoded: one row per request, its KV cache, mask and next inputs."""

    jobs: list[_Job]
    cache: Any
    mask: Any  # (rows, cached length): 1 where a row has a token, 0 for left padding
    positions: Any  # (rows, 1): the position of each row's next input token
    next_ids: Any  # (rows, 1): each row's last sampled token, the next input


@dataclass(eq=False)
class _Command:
    action: Callable[[], None]
    future: asyncio.Future[None]
    loop: asyncio.AbstractEventLoop
    error: BaseException | None = field(default=None)


class TransformersEngine(Engine):
    """Batched, streaming generation with transformers and PEFT-format LoRA adapters."""

    name = "transformers"

    def __init__(
        self,
        model_dir: Path,
        *,
        max_batch: int = 16,
        max_model_len: int = 2048,
        max_loras: int = 4,
        batch_wait_s: float = 0.005,
        dtype: str = "float32",
    ) -> None:
        import torch
        from transformers import AutoModelForCausalLM, GenerationConfig

        self._torch = torch
        self._model_dir = Path(model_dir)
        self._max_batch = max_batch
        self._max_len = max_model_len
        self._max_loras = max_loras
        self._batch_wait = batch_wait_s
        if dtype not in ("float32", "bfloat16"):
            raise EngineError(f"dtype {dtype!r} is not float32 or bfloat16 (inference.precision)")
        base = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
        base.eval()
        self._model: Any = base
        self._lora = MultiLora(base)
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
        return self._lora.names()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[TokenDelta, None]:
        if self._stopped:
            raise EngineError("the engine is closed")
        if request.adapter is not None and request.adapter not in self._lora.names():
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
        check_room(name, self._lora.names(), self._max_loras)
        prepared = await asyncio.to_thread(MultiLora.prepare, Path(path))  # file IO off the engine
        await self._call(lambda: self._lora.install(name, prepared))

    async def unload_adapter(self, name: str) -> None:
        if name not in self._lora.names():
            raise AdapterLoadError(f"no adapter named {name!r} is loaded")
        await self._call(lambda: self._lora.remove(name))

    async def close(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._inbox.put(None)
        await asyncio.to_thread(self._thread.join, 30)

    async def _call(self, action: Callable[[], None]) -> None:
        if self._stopped:
            raise AdapterLoadError("the engine is closed")
        loop = asyncio.get_running_loop()
        command = _Command(action, loop.create_future(), loop)
        self._inbox.put(command)
        await command.future

    # -- the worker thread ------------------------------------------------------------------------

    def _run(self) -> None:
        """The scheduler: admit waiting requests into the running batch, step it, drop finished rows.

        Continuous batching: a request that arrives while others are decoding is prefilled on its
        own and merged into the running batch at the next step instead of waiting for it to end."""
        running: _Running | None = None
        waiting: deque[_Job] = deque()
        while True:
            if running is None and not waiting:
                alive = self._take(waiting, block=True)
                if alive:
                    alive = self._gather(waiting)
            else:
                alive = self._take(waiting, block=False)
            if not alive:
                self._shutdown(running, waiting)
                return
            free = self._max_batch - (len(running.jobs) if running else 0)
            admitted: list[_Job] = []
            while waiting and len(admitted) < free:
                job = waiting.popleft()
                if not job.cancelled:
                    admitted.append(job)
            with self._torch.inference_mode():
                if admitted:
                    try:
                        running = self._merge(running, self._prefill(admitted))
                    except Exception as exc:  # a failed prefill fails the newcomers only
                        logger.exception("prefill failed")
                        self._fail(None, deque(admitted), f"generation failed: {exc}")
                elif running is not None:
                    try:
                        self._step(running)
                    except Exception as exc:  # a failed step fails its requests, never the engine
                        logger.exception("generation failed")
                        self._fail(running, deque(), f"generation failed: {exc}")
                        running = None
                running = self._prune(running)

    def _take(self, waiting: deque[_Job], block: bool) -> bool:
        """Move inbox items: requests to `waiting`, commands executed. False once closing."""
        while True:
            try:
                item = self._inbox.get() if block else self._inbox.get_nowait()
            except queue.Empty:
                return True
            block = False
            if item is None:
                return False
            if isinstance(item, _Command):
                self._execute(item)
            else:
                waiting.append(item)

    def _gather(self, waiting: deque[_Job]) -> bool:
        """Wait `batch_wait_s` after a first request so that close arrivals share one prefill."""
        if self._batch_wait <= 0 or len(waiting) >= self._max_batch:
            return True
        try:
            item = self._inbox.get(timeout=self._batch_wait)
        except queue.Empty:
            return True
        if item is None:
            return False
        if isinstance(item, _Command):
            self._execute(item)
        else:
            waiting.append(item)
        return self._take(waiting, block=False)

    def _shutdown(self, running: _Running | None, waiting: deque[_Job]) -> None:
        """Answer everything still queued: requests fail, commands are refused."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Job):
                waiting.append(item)
            elif isinstance(item, _Command):
                with contextlib.suppress(RuntimeError):
                    item.loop.call_soon_threadsafe(
                        _settle, item.future, AdapterLoadError("the engine is shutting down"))
        self._fail(running, waiting, "the engine is shutting down; retry on another replica")

    def _fail(self, running: _Running | None, waiting: deque[_Job], message: str) -> None:
        for job in (running.jobs if running else []) + list(waiting):
            if not job.done:
                job.done = True
                job.emit(EngineError(message))

    def _execute(self, command: _Command) -> None:
        error: BaseException | None = None
        try:
            # Commands run between two decoding steps; keep them out of inference mode so that
            # nothing they create becomes an "inference tensor".
            with self._torch.inference_mode(False):
                command.action()
        except Exception as exc:
            error = exc if isinstance(exc, AdapterLoadError) else AdapterLoadError(str(exc))
        with contextlib.suppress(RuntimeError):
            command.loop.call_soon_threadsafe(_settle, command.future, error)

    def _forward(self, ids: Any, mask: Any, positions: Any, cache: Any, jobs: list[_Job]) -> Any:
        with self._lora.route([job.request.adapter for job in jobs]):
            return self._model(input_ids=ids, attention_mask=mask, position_ids=positions,
                               past_key_values=cache, use_cache=True, logits_to_keep=1)

    def _prefill(self, jobs: list[_Job]) -> _Running:
        """Run the prompts of newly admitted `jobs` (left-padded together) and sample their first token."""
        from transformers import DynamicCache

        torch = self._torch
        for job in jobs:
            seed = job.request.sampling.seed
            job.generator = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
            job.budget = min(job.request.sampling.max_tokens,
                             self._max_len - len(job.request.prompt_token_ids))
        width = max(len(job.request.prompt_token_ids) for job in jobs)
        ids = torch.full((len(jobs), width), self._pad, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for row, job in enumerate(jobs):  # left padding: every row's next token is at the end
            prompt = job.request.prompt_token_ids
            ids[row, width - len(prompt) :] = torch.tensor(prompt)
            mask[row, width - len(prompt) :] = 1
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        out = self._forward(ids, mask, positions, cache, jobs)
        batch = _Running(jobs, out.past_key_values, mask, positions[:, -1:] + 1, ids[:, -1:])
        self._emit(batch, out.logits[:, -1, :].float())
        return batch

    def _step(self, batch: _Running) -> None:
        """One decoding step of every running row."""
        torch = self._torch
        batch.mask = torch.cat([batch.mask, torch.ones((len(batch.jobs), 1), dtype=torch.long)], dim=1)
        out = self._forward(batch.next_ids, batch.mask, batch.positions, batch.cache, batch.jobs)
        batch.cache = out.past_key_values
        batch.positions = batch.positions + 1
        self._emit(batch, out.logits[:, -1, :].float())

    def _emit(self, batch: _Running, logits: Any) -> None:
        """Sample each row's next token from `logits` and stream it to its request."""
        tokens, logprobs = self._sample(batch.jobs, logits)
        for row, job in enumerate(batch.jobs):
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
            elif job.generated >= job.budget:
                reason = "length"
            job.done = reason is not None
            job.emit(TokenDelta([token], [logprobs[row]], reason))
        batch.next_ids = self._torch.tensor(tokens, dtype=self._torch.long).unsqueeze(1)

    def _merge(self, running: _Running | None, new: _Running) -> _Running:
        """One batch of both: caches and masks left-padded to a common length, then stacked."""
        if running is None:
            return new
        torch = self._torch
        length = max(running.mask.shape[1], new.mask.shape[1])

        def pad(t: Any, to: int) -> Any:  # zeros on the left of the sequence dimension (-2 or -1)
            missing = to - (t.shape[-2] if t.dim() == 4 else t.shape[-1])
            if missing == 0:
                return t
            shape = list(t.shape)
            shape[-2 if t.dim() == 4 else -1] = missing
            return torch.cat([t.new_zeros(shape), t], dim=-2 if t.dim() == 4 else -1)

        for mine, theirs in zip(running.cache.layers, new.cache.layers, strict=True):
            mine.keys = torch.cat([pad(mine.keys, length), pad(theirs.keys, length)])
            mine.values = torch.cat([pad(mine.values, length), pad(theirs.values, length)])
        running.mask = torch.cat([pad(running.mask, length), pad(new.mask, length)])
        running.positions = torch.cat([running.positions, new.positions])
        running.next_ids = torch.cat([running.next_ids, new.next_ids])
        running.jobs = running.jobs + new.jobs
        return running

    def _prune(self, batch: _Running | None) -> _Running | None:
        """Drop finished rows, and the padding columns no remaining row needs."""
        if batch is None:
            return None
        keep = [row for row, job in enumerate(batch.jobs) if not job.done]
        if not keep:
            return None
        torch = self._torch
        if len(keep) < len(batch.jobs):
            index = torch.tensor(keep, dtype=torch.long)
            batch.cache.batch_select_indices(index)
            batch.mask = batch.mask[index]
            batch.positions = batch.positions[index]
            batch.next_ids = batch.next_ids[index]
            batch.jobs = [batch.jobs[row] for row in keep]
        start = int(batch.mask.any(dim=0).int().argmax())
        if start > 0:
            batch.mask = batch.mask[:, start:]
            for layer in batch.cache.layers:
                layer.keys = layer.keys[:, :, start:, :]
                layer.values = layer.values[:, :, start:, :]
        return batch

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
