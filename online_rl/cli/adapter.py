"""`online-rl adapter seal|verify`: lineage manifests of adapter folders made outside the trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from online_rl.registry import load_signing_key, verify_adapter_dir, write_lineage

__all__ = ["adapter_app"]

adapter_app = typer.Typer(help="Adapter folders: write or check their lineage manifest.",
                          no_args_is_help=True)


@adapter_app.command("seal")
def seal(
    folder: Annotated[Path, typer.Argument(help="A PEFT LoRA folder (adapter_model.safetensors + config).")],
    base: Annotated[str, typer.Option(help="The base model id it was trained on (SmolLM2-135M-Instruct).")],
    sign: Annotated[Path | None, typer.Option(
        help="Sign the manifest with this Ed25519 key (PEM, `online-rl keys signing`), for serving that "
             "lists its public key in mlflow.trusted_signers.")] = None,
) -> None:
    """Hash the adapter's files into lineage.json so that serving accepts it."""
    manifest = write_lineage(folder, base, load_signing_key(sign) if sign is not None else None)
    signed = f"; signed by {manifest.signer}" if manifest.signer else ""
    typer.echo(f"{folder / 'lineage.json'}: adapter sha256 {manifest.adapter_sha256}{signed}")


@adapter_app.command("verify")
def verify(
    folder: Annotated[Path, typer.Argument(help="An adapter folder with lineage.json.")],
    base: Annotated[str | None, typer.Option(help="Also check the base model id.")] = None,
    signer: Annotated[list[str] | None, typer.Option(
        help="Also require a signature by this public key (repeatable), as serving with "
             "mlflow.trusted_signers does.")] = None,
) -> None:
    """Check the folder as serving would (safetensors only, hashes, base model, signature)."""
    manifest = verify_adapter_dir(folder, base, signer or ())
    typer.echo(f"ok: {len(manifest.files)} files match; base model {manifest.base_model}")
