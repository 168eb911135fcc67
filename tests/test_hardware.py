"""`precision: auto`: the decision rule (pure), the real probe under an AVX2-only CPU (emulated by capping
torch's and oneDNN's ISA), its cache, the warning for a forced bf16, and bf16 serving."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from online_rl.hardware import MatmulProbe, choose_precision, machine_line, resolve_precision

AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             # the shipped default, not the harness's float32 pin (tests/conftest.py)
             "ORL_TRAINER__PRECISION": "auto", "ORL_INFERENCE__PRECISION": "auto",
             "ORL_HYBRID__PRECISION": "auto"}


def probe(fp32: float, bf16: float) -> MatmulProbe:
    return MatmulProbe("cpu", 576, 2, fp32, bf16)


def test_auto_picks_bf16_only_where_it_measures_enough_faster() -> None:
    assert choose_precision("auto", probe(40.0, 240.0)).precision == "bf16"  # an AMX CPU: x6
    assert choose_precision("auto", probe(40.0, 0.45)).precision == "fp32"  # AVX2-only: x0.01
    # faster, but not by enough to pay for the casts and element-wise work around the products
    assert choose_precision("auto", probe(40.0, 48.0)).precision == "fp32"
    choice = choose_precision("auto", probe(40.0, 0.45))
    assert "bf16 0.5 vs fp32 40.0 GFLOP/s" in choice.reason and "< x1.5" in choice.reason


def test_explicit_settings_and_gpus() -> None:
    assert choose_precision("fp32", probe(1.0, 100.0)).precision == "fp32"
    assert choose_precision("bf16", probe(100.0, 1.0)).precision == "bf16"  # forced: kept, and warned
    assert choose_precision("auto", None, native_bf16=True).precision == "bf16"  # e.g. an A100
    assert choose_precision("auto", None, native_bf16=False).precision == "fp32"  # e.g. a T4
    with pytest.raises(ValueError, match="not one of auto, fp32, bf16"):
        choose_precision("fp16", probe(1.0, 1.0))


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow
def test_auto_picks_fp32_on_an_avx2_only_cpu(tmp_path: Path) -> None:
    """The real probe in a process that sees only AVX2: bf16 products crawl there, so auto is fp32, and
    `online-rl version` says so with the machine's ISA."""
    env = {**os.environ, **AVX2_ONLY, "ORL_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "online_rl.cli", "version", "--json"], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["machine"]["isa"] == "AVX2"
    assert "ATEN_CPU_CAPABILITY=avx2" in found["machine"]["isa_capped_by"]
    trainer = found["precision"]["trainer.precision"]
    assert trainer["requested"] == "auto" and trainer["precision"] == "fp32"
    assert trainer["probe"]["bf16_gflops"] < trainer["probe"]["fp32_gflops"]
    # measured once per machine: the cache holds the AVX2 entry
    cached = json.loads((tmp_path / "hardware" / "precision.json").read_text())
    assert any(entry["bf16_gflops"] == trainer["probe"]["bf16_gflops"] for entry in cached.values())


@pytest.mark.slow
def test_forced_bf16_on_an_avx2_only_cpu_warns_with_the_figures(tmp_path: Path) -> None:
    code = ("import logging; logging.basicConfig(level=logging.INFO); from pathlib import Path; "
            "from online_rl.hardware import resolve_precision; "
            f"print(resolve_precision('bf16', cache_dir=Path({str(tmp_path)!r}), what='trainer.precision')"
            ".precision)")
    out = _run(code, AVX2_ONLY)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "bf16"  # a forced setting is kept ...
    assert "trainer.precision=bf16 on a CPU where bfloat16 measures slower than float32" in out.stderr
    assert "GFLOP/s" in out.stderr and "set trainer.precision=auto or fp32" in out.stderr


def test_the_probe_is_cached_per_machine(tmp_path: Path) -> None:
    first = resolve_precision("auto", hidden=64, threads=1, cache_dir=tmp_path)
    second = resolve_precision("auto", hidden=64, threads=1, cache_dir=tmp_path)
    assert first.probe is not None and second.probe == first.probe  # the same measurement, not a new one
    other = resolve_precision("auto", hidden=128, threads=1, cache_dir=tmp_path)
    assert other.probe is not None and other.probe.hidden == 128  # another size is another entry
    assert len(json.loads((tmp_path / "hardware" / "precision.json").read_text())) == 2


def test_machine_line_names_cpu_isa_cores_and_precision() -> None:
    line = machine_line("fp32")
    assert line.startswith("machine: ") and "ISA " in line and " cores" in line and "precision fp32" in line
