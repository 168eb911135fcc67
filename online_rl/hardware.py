"""What this machine computes fast: the precision behind `precision: auto`, and the machine line.

bfloat16 is the fast choice on GPUs with native bf16 (compute capability 8 and up) and on CPUs with
AMX; on a CPU without native bf16 units (AVX2-only) a bf16 matrix product was measured ~90x slower
than float32. So `auto` never assumes: on CUDA it asks the device, on a CPU it times a bf16 and a
float32 matrix product of the model's hidden size with the threads the process will train or serve
with (alternating the two, best of each), and picks bf16 only when it is at least `BF16_MIN_SPEEDUP`
times faster — casts and element-wise work eat the first part of the gain (on an AMX CPU a 6x faster
product gave a 2.2x faster training step). The result is cached per machine (CPU model and flags,
torch's ISA, the oneDNN ISA cap, threads, hidden size) under `<cache_dir>/hardware/`.

`machine_line()` is the one line every benchmark result and the demo report carry: CPU model, the ISA
torch dispatches to, cores, and the precision. Knows nothing about models, training or serving.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal

__all__ = [
    "BF16_MIN_SPEEDUP",
    "MatmulProbe",
    "Precision",
    "PrecisionChoice",
    "choose_precision",
    "cpu_model",
    "machine_info",
    "machine_line",
    "measure_matmul",
    "model_hidden_size",
    "resolve_precision",
]

logger = logging.getLogger(__name__)

Precision = Literal["fp32", "bf16"]
Requested = Literal["auto", "fp32", "bf16"]
BF16_MIN_SPEEDUP = 1.5  # bf16 products must be this much faster than fp32 for `auto` to pick bf16
_ROWS = 128  # tokens per probe product: small enough that an emulated bf16 product stays well under 1 s


@dataclass(frozen=True)
class MatmulProbe:
    """Measured matrix-product rates (GFLOP/s) of one device at one size and thread count."""

    device: str
    hidden: int
    threads: int
    fp32_gflops: float
    bf16_gflops: float
    measured_at: float = 0.0

    @property
    def bf16_speedup(self) -> float:
        return self.bf16_gflops / self.fp32_gflops if self.fp32_gflops > 0 else 0.0


@dataclass(frozen=True)
class PrecisionChoice:
    """What a `precision` setting resolved to, and why."""

    requested: str
    precision: Precision
    reason: str
    probe: MatmulProbe | None = None
    machine: str = ""  # the machine line of where it was decided (a Ray worker's node may not be ours)

    def describe(self) -> str:
        return f"{self.requested} -> {self.precision} ({self.reason})"

    def as_dict(self) -> dict[str, object]:
        return {"requested": self.requested, "precision": self.precision, "reason": self.reason,
                "probe": asdict(self.probe) if self.probe else None, "machine": self.machine}


def choose_precision(requested: str, probe: MatmulProbe | None, native_bf16: bool | None = None,
                     min_speedup: float = BF16_MIN_SPEEDUP) -> PrecisionChoice:
    """The decision, pure: `requested` (auto, fp32, bf16) given a CPU probe, or for a GPU whether it
    runs bf16 natively (`native_bf16`, then `probe` may be None)."""
    if requested not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision {requested!r} is not one of auto, fp32, bf16")
    if requested == "fp32":
        return PrecisionChoice(requested, "fp32", "as configured", probe)
    if native_bf16 is not None:  # a GPU: its compute capability decides
        if requested == "bf16" or native_bf16:
            why = "the GPU runs bfloat16 natively" if native_bf16 else "as configured (no native bf16!)"
            return PrecisionChoice(requested, "bf16", why, probe)
        return PrecisionChoice(requested, "fp32", "the GPU has no native bfloat16", probe)
    if probe is None:
        raise ValueError("a CPU precision choice needs a matrix-product probe")
    figures = (f"bf16 {probe.bf16_gflops:.1f} vs fp32 {probe.fp32_gflops:.1f} GFLOP/s, "
               f"x{probe.bf16_speedup:.2f}, hidden {probe.hidden}, {probe.threads} thread(s)")
    if requested == "bf16":
        return PrecisionChoice(requested, "bf16", f"as configured; measured {figures}", probe)
    if probe.bf16_speedup >= min_speedup:
        return PrecisionChoice(requested, "bf16", f"measured {figures} >= x{min_speedup}", probe)
    return PrecisionChoice(requested, "fp32", f"measured {figures} < x{min_speedup}", probe)


def _rate(dtype: object, hidden: int, device: str, seconds: float) -> float:
    import torch

    a = torch.randn(_ROWS, hidden, device=device).to(dtype)  # type: ignore[call-overload]
    b = torch.randn(hidden, hidden, device=device).to(dtype)  # type: ignore[call-overload]
    a @ b  # warm-up: first-call dispatch and allocation
    count, start = 0, time.perf_counter()
    while True:
        a @ b
        count += 1
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return 2.0 * _ROWS * hidden * hidden * count / elapsed / 1e9


def measure_matmul(hidden: int, threads: int | None = None, device: str = "cpu", rounds: int = 2,
                   seconds: float = 0.1) -> MatmulProbe:
    """bf16 and fp32 product rates at `hidden`, alternating the two over `rounds`, best of each."""
    import torch

    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        fp32, bf16 = 0.0, 0.0
        for _ in range(rounds):
            fp32 = max(fp32, _rate(torch.float32, hidden, device, seconds))
            bf16 = max(bf16, _rate(torch.bfloat16, hidden, device, seconds))
        return MatmulProbe(device, hidden, torch.get_num_threads(), round(fp32, 2), round(bf16, 2),
                           time.time())
    finally:
        torch.set_num_threads(previous)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo; the platform's processor name elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def machine_info(precision: str | None = None) -> dict[str, object]:
    """CPU model, torch's ISA, native bf16 units, cores, GPU, and `precision` when given."""
    import torch

    flags = _cpu_flags()
    bf16_units = [name for name in ("amx_bf16", "avx512_bf16") if name in flags]
    info: dict[str, object] = {
        "cpu": cpu_model(),
        "isa": torch.backends.cpu.get_cpu_capability(),
        "bf16_units": ",".join(bf16_units) or "none",
        "cores": os.cpu_count() or 1,
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    capped = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA") if os.environ.get(k)}
    if capped:
        info["isa_capped_by"] = " ".join(f"{k}={v}" for k, v in sorted(capped.items()))
    if precision is not None:
        info["precision"] = precision
    return info


def machine_line(precision: str | None = None) -> str:
    """`machine: <cpu> · ISA <isa> (bf16 units: ...) · <n> cores · [GPU] · precision <p>`."""
    info = machine_info(precision)
    parts = [str(info["cpu"]), f"ISA {info['isa']} (bf16 units: {info['bf16_units']}"
             + (f"; capped by {info['isa_capped_by']})" if "isa_capped_by" in info else ")"),
             f"{info['cores']} cores", f"torch {info['torch']}"]
    if info["gpu"]:
        parts.append(f"GPU {info['gpu']}")
    if precision is not None:
        parts.append(f"precision {precision}")
    return "machine: " + " · ".join(parts)


def _fingerprint(device: str, hidden: int, threads: int) -> str:
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(torch.device(device))
        key = ["cuda", name, torch.__version__, str(hidden)]
    else:
        key = [cpu_model(), ",".join(sorted(_cpu_flags())), torch.__version__,
               torch.backends.cpu.get_cpu_capability(), os.environ.get("ONEDNN_MAX_CPU_ISA", ""),
               str(threads), str(hidden)]
    return hashlib.sha256("\n".join(key).encode()).hexdigest()[:24]


def _cached_probe(cache: Path | None, key: str) -> MatmulProbe | None:
    if cache is None:
        return None
    try:
        entry = json.loads(cache.read_text()).get(key)
        return MatmulProbe(**entry) if entry else None
    except (OSError, ValueError, TypeError):
        return None


def _store_probe(cache: Path | None, key: str, probe: MatmulProbe) -> None:
    if cache is None:
        return
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        try:
            entries = json.loads(cache.read_text())
        except (OSError, ValueError):
            entries = {}
        entries[key] = asdict(probe)
        staging = cache.with_name(f".{cache.name}.{os.getpid()}")
        staging.write_text(json.dumps(entries, indent=1, sort_keys=True))
        os.replace(staging, cache)
    except OSError as exc:  # a read-only cache only costs a re-measurement next time
        logger.debug("could not cache the precision probe in %s: %s", cache, exc)


def resolve_precision(requested: str, device: str = "cpu", hidden: int = 576, threads: int | None = None,
                      cache_dir: Path | None = None, what: str = "precision", log_choice: bool = True
                      ) -> PrecisionChoice:
    """Resolve a `precision` setting for `device` (see the module docstring); logs the decision (unless
    `log_choice` is off) and warns when a forced bf16 measures slower than fp32. `what` names the
    setting in the log."""
    import torch

    if requested == "fp32":
        return replace(choose_precision("fp32", None), machine=machine_line("fp32"))
    if device.startswith("cuda"):
        major, _ = torch.cuda.get_device_capability(torch.device(device))
        choice = choose_precision(requested, None, native_bf16=major >= 8)
        if requested == "bf16" and major < 8:
            logger.warning("%s=bf16 on a GPU without native bfloat16 (compute capability %d): set %s=auto or "
                           "fp32", what, major, what,
                           extra={"event": "precision_warning", **choice.as_dict()})
    else:
        threads = threads or torch.get_num_threads()
        cache = cache_dir / "hardware" / "precision.json" if cache_dir is not None else None
        key = _fingerprint(device, hidden, threads)
        probe = _cached_probe(cache, key)
        if probe is None:
            probe = measure_matmul(hidden, threads, device)
            _store_probe(cache, key, probe)
        choice = choose_precision(requested, probe)
        if requested == "bf16" and probe.bf16_speedup < 1.0:
            logger.warning("%s=bf16 on a CPU where bfloat16 measures slower than float32 (%s): set %s=auto "
                           "or fp32", what, choice.reason.removeprefix("as configured; measured "), what,
                           extra={"event": "precision_warning", **choice.as_dict()})
    choice = replace(choice, machine=machine_line(choice.precision))
    if log_choice:
        logger.info("%s: %s", what, choice.describe(), extra={"event": "precision", "setting": what,
                                                          "precision": choice.precision})
    return choice


def model_hidden_size(model_dir: Path | str, default: int = 576) -> int:
    """The model's hidden size from its config.json (the probe's product size)."""
    try:
        return int(json.loads((Path(model_dir) / "config.json").read_text())["hidden_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return default


def pin_process(cores: set[int], within: set[int] | None = None) -> set[int]:
    """Bind every thread of this process (and the threads it starts later) to `cores`, intersected with
    `within` (default: the cores this thread may use now); returns the cores kept (empty: nothing done,
    e.g. off Linux)."""
    if not hasattr(os, "sched_setaffinity"):
        return set()
    allowed = (os.sched_getaffinity(0) if within is None else within) & set(cores)
    if not allowed:
        return set()
    for task in Path("/proc/self/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), allowed)
        except (ProcessLookupError, PermissionError, OSError):
            continue  # a thread that ended meanwhile
    return allowed
