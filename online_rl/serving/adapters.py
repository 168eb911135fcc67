"""Adapter versions in serving: loading, verifying, naming, leasing and draining.

`AdapterManager` sits between the service and an `Engine`. It resolves what a request asks for
(the base model id, an immutable version name such as `online-rl-policy-v3`, or an alias such as
`online-rl-policy` that points at one version) and hands out a lease on that version for the
request's whole life. A hot swap loads the new version, verifies it against its lineage manifest,
then moves the alias in one step: requests in flight keep the version they started with. A
version can be unloaded only when no alias points at it, after its last lease is returned.

A name is never reused for other weights: loading a known name with a different sha256 fails.
This module knows nothing about HTTP or the bus.

Disk: each version's files are copied or downloaded into a folder of their own under the download
folder, kept while the version is loaded (an engine may read them again, e.g. vLLM after evicting it
from its LoRA cache) and deleted when it is unloaded, or at once when its load fails. Each folder has
an owner file (`<folder>.owner`: host and process id), so a replica that starts deletes what a dead
process on the same host left (a SIGKILL runs no clean-up), never another live replica's.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from online_rl.faults import failpoint
from online_rl.registry import AdapterRejected, LineageManifest, download_version, verify_adapter_dir
from online_rl.serving.engine import Engine
from online_rl.serving.errors import AdapterUnavailable, UnknownModel, VersionConflict

__all__ = ["AdapterInfo", "AdapterManager", "AdapterSource"]

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:/(?P<version>\d+)|@(?P<alias>[A-Za-z0-9_-]+))$")


@dataclass(frozen=True)
class AdapterSource:
    """Where a version's files are: a local folder or an MLflow model URI (`models:/name/3`)."""

    uri: str

    @property
    def is_mlflow(self) -> bool:
        return self.uri.startswith("models:/")


@dataclass
class AdapterInfo:
    """One resident adapter version."""

    name: str
    sha256: str
    source: str
    manifest: LineageManifest
    loaded_at: float = field(default_factory=time.time)
    in_flight: int = 0
    draining: bool = False
    folder: Path | None = None  # this process's copy of its files (deleted when it is unloaded)


class AdapterManager:
    """The versions an engine serves, the aliases that point at them, and their leases."""

    def __init__(self, engine: Engine, base_model: str, download_dir: Path,
                 tracking_uri: str | None = None, trusted_signers: Sequence[str] = (),
                 artifact_roots: Sequence[str] | None = None) -> None:
        self._engine = engine
        # where a version's files may come from (None: anywhere its MLflow source says)
        self.artifact_roots = None if artifact_roots is None else tuple(artifact_roots)
        self.base_model = base_model
        self.trusted_signers = tuple(trusted_signers)  # empty: any manifest whose hashes match
        self._download_dir = Path(download_dir)
        self._tracking_uri = tracking_uri
        self._versions: dict[str, AdapterInfo] = {}
        self._aliases: dict[str, str] = {}
        self._known: dict[str, str] = {}  # every name seen by this process -> its sha256
        self._base_in_flight = 0
        self._lock = asyncio.Lock()
        self.swept = sweep_orphans(self._download_dir)  # what dead processes on this host left

    # -- requests ---------------------------------------------------------------------------------

    def resolve(self, model: str) -> str | None:
        """The adapter version that serves `model` (None for the base model)."""
        if model == self.base_model:
            return None
        name = self._aliases.get(model, model)
        info = self._versions.get(name)
        if info is None or info.draining:
            raise UnknownModel(
                f"model {model!r} is not served here; GET /v1/models lists the base model, the loaded "
                "versions and their aliases"
            )
        return name

    @contextmanager
    def lease(self, model: str) -> Iterator[str | None]:
        """Hold the version serving `model` for one request; yields the version (None = base)."""
        name = self.resolve(model)
        info = self._versions[name] if name is not None else None
        if info is not None:
            info.in_flight += 1
        else:
            self._base_in_flight += 1
        try:
            yield name
        finally:
            if info is not None:
                info.in_flight -= 1
            else:
                self._base_in_flight -= 1

    def versions(self) -> list[AdapterInfo]:
        return list(self._versions.values())

    def aliases(self) -> dict[str, str]:
        return dict(self._aliases)

    # -- admin ------------------------------------------------------------------------------------

    async def load(self, source: str, name: str | None = None, alias: str | None = None) -> AdapterInfo:
        """Load the version at `source` as `name` (an MLflow source names itself), verify it, and
        point `alias` at it. A failure leaves serving exactly as it was."""
        src = AdapterSource(source)
        if alias is not None:
            self._check_alias(alias)
        async with self._lock:
            try:
                folder, version = await asyncio.to_thread(self._fetch, src, name)
            except Exception as exc:
                if _disk_full(exc):
                    raise AdapterUnavailable(
                        f"the adapter disk {self._download_dir} is full ({exc}); nothing of the "
                        "version was kept: free space there or give inference.adapters_dir a larger "
                        "volume, then retry") from exc
                raise
            failpoint("serving.mid_load")
            try:
                return await self._load_fetched(src, folder, version, alias)
            finally:  # a copy nothing serves from (the load failed, or the version was loaded already)
                info = self._versions.get(version)
                if info is None or info.folder is None or not folder.is_relative_to(info.folder):
                    _remove_copy(folder, self._download_dir)

    async def _load_fetched(self, src: AdapterSource, folder: Path, version: str,
                            alias: str | None) -> AdapterInfo:
        """`load` once the files are here (under the lock)."""
        if version == self.base_model or version in self._aliases or version == alias:
            raise VersionConflict(f"{version!r} is already the base model's or an alias's name; "
                                  "choose another version name")
        manifest = await asyncio.to_thread(verify_adapter_dir, folder, self.base_model,
                                           self.trusted_signers)
        known = self._known.get(version)
        if known is not None and known != manifest.adapter_sha256:
            raise VersionConflict(
                f"the name {version!r} already named other weights (sha256 {known[:12]}…); version "
                "names are immutable: register the new weights as a new version"
            )
        info = self._versions.get(version)
        if info is not None and info.draining:
            raise VersionConflict(f"{version} is being unloaded; load it again once that finished")
        if info is None:
            await self._engine.load_adapter(version, folder)
            info = AdapterInfo(version, manifest.adapter_sha256, src.uri, manifest,
                               folder=_copy_root(folder, self._download_dir))
            self._versions[version] = info
            self._known[version] = info.sha256
            logger.info("loaded adapter %s (sha256 %s) from %s", version, info.sha256[:12], src.uri)
        if alias is not None:
            self._point(alias, version)
        return info

    async def set_alias(self, alias: str, name: str) -> None:
        async with self._lock:
            self._point(alias, name)

    def _check_alias(self, alias: str) -> None:
        if not _NAME.match(alias) or alias == self.base_model or alias in self._known:
            raise VersionConflict(f"{alias!r} cannot be an alias: it is the base model, a version name, "
                                  "or not made of letters, digits and ._-")

    def _point(self, alias: str, name: str) -> None:
        self._check_alias(alias)
        if name not in self._versions or self._versions[name].draining:
            raise UnknownModel(f"version {name!r} is not loaded; load it first")
        previous = self._aliases.get(alias)
        self._aliases[alias] = name
        logger.info("alias %s: %s -> %s", alias, previous, name)

    async def unload(self, name: str, timeout_s: float = 60.0) -> None:
        """Stop new requests on `name`, wait for its in-flight requests, then free it. The wait
        does not hold the manager's lock: aliases can move (a rollback) while a version drains."""
        async with self._lock:
            info = self._versions.get(name)
            if info is None or info.draining:
                raise UnknownModel(f"version {name!r} is not loaded (or is already being unloaded)")
            pointing = sorted(alias for alias, target in self._aliases.items() if target == name)
            if pointing:
                raise VersionConflict(
                    f"alias {', '.join(pointing)} still points at {name}; point it at another version "
                    "(or delete the alias) before unloading"
                )
            info.draining = True  # `resolve` and `_point` refuse it from now on
        unloaded = False
        try:
            deadline = time.monotonic() + timeout_s
            while info.in_flight > 0:
                if time.monotonic() > deadline:
                    raise VersionConflict(
                        f"{info.in_flight} requests still run on {name} after {timeout_s:g}s; try again"
                    )
                await asyncio.sleep(0.01)
            async with self._lock:
                await self._engine.unload_adapter(name)
                del self._versions[name]
                unloaded = True
            if info.folder is not None:
                _remove_copy(info.folder, self._download_dir)
            logger.info("unloaded adapter %s", name)
        finally:
            if not unloaded:
                info.draining = False

    async def delete_alias(self, alias: str) -> None:
        async with self._lock:
            if self._aliases.pop(alias, None) is None:
                raise UnknownModel(f"there is no alias {alias!r}")

    # -- sources ----------------------------------------------------------------------------------

    def _fetch(self, src: AdapterSource, name: str | None) -> tuple[Path, str]:
        """The local folder of `src` and the version's serving name."""
        if not src.is_mlflow:
            folder = Path(src.uri).expanduser()
            if name is None:
                raise AdapterRejected("a local adapter needs a version name (field `name`)")
            _check_name(name)
            if not folder.is_dir():
                raise AdapterRejected(f"{folder} is not a folder; give the adapter's folder")
            # Verify and load a private copy, so that nobody can change the files in between.
            return self._private_copy(folder, name), name
        match = _MODELS_URI.match(src.uri)
        if match is None:
            raise AdapterRejected(f"{src.uri!r} is not an MLflow model URI; use models:/<name>/<version> "
                                  "or models:/<name>@<alias>")
        version = match["version"] or self._alias_version(match["name"], match["alias"])
        serving_name = f"{match['name']}-v{version}"
        if name is not None and name != serving_name:
            raise AdapterRejected(f"an MLflow version is served as {serving_name!r}; leave `name` empty")
        return self._download(match["name"], version, serving_name), serving_name

    def _private_copy(self, folder: Path, name: str) -> Path:
        dest = self._unique(self._download_dir / "local" / name)
        try:
            shutil.copytree(folder, dest, symlinks=False)
        except BaseException:
            _remove_copy(dest, self._download_dir)
            raise
        return dest

    @staticmethod
    def _unique(parent: Path) -> Path:
        """A fresh folder path under `parent`, with its owner file: replicas sharing a cache folder
        (several on one machine) never download into, or delete, each other's copies."""
        parent.mkdir(parents=True, exist_ok=True)
        folder = parent / uuid.uuid4().hex[:12]
        owner = folder.with_name(folder.name + OWNER_SUFFIX)
        try:
            owner.write_text(_owner())
        except BaseException:  # a full disk: no empty owner file left behind
            owner.unlink(missing_ok=True)
            raise
        return folder

    def _alias_version(self, registered: str, alias: str) -> str:
        from mlflow import MlflowClient
        from mlflow.exceptions import MlflowException

        try:
            client = MlflowClient(self._tracking_uri, registry_uri=self._tracking_uri)
            return str(client.get_model_version_by_alias(registered, alias).version)
        except MlflowException as exc:
            raise AdapterRejected(f"MLflow has no version of {registered!r} with alias {alias!r}") from exc

    def _download(self, registered: str, version: str, serving_name: str) -> Path:
        import mlflow
        from mlflow.exceptions import MlflowException

        dest = self._unique(self._download_dir / serving_name)
        uri = f"models:/{registered}/{version}"
        try:
            try:
                dest.mkdir()
                store = self._tracking_uri or mlflow.get_tracking_uri()
                return download_version(store, registered, version, dest, self.artifact_roots)
            except BaseException:
                _remove_copy(dest, self._download_dir)  # a partial download (a full disk, MLflow away)
                raise
        except MlflowException as exc:
            if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                raise AdapterRejected(f"MLflow could not provide {uri}: {exc.message}") from exc
            raise AdapterUnavailable(f"MLflow failed while fetching {uri} ({exc.message}); retry") from exc
        except ValueError as exc:
            raise AdapterRejected(str(exc)) from exc
        except OSError as exc:  # the artifact store away (a network share, an object store)
            if _disk_full(exc):
                raise  # `load` names the full disk
            raise AdapterUnavailable(f"could not fetch {uri} ({exc}); retry") from exc


OWNER_SUFFIX = ".owner"


def _owner() -> str:
    return f"{socket.gethostname()} {os.getpid()}"


def _copy_root(folder: Path, download_dir: Path) -> Path | None:
    """The per-load folder that holds `folder` (the nearest one with an owner file), if any."""
    top = download_dir.resolve()
    here = folder.resolve()
    while here != top and top in here.parents:
        if here.with_name(here.name + OWNER_SUFFIX).is_file():
            return here
        here = here.parent
    return None


def _remove_copy(folder: Path, download_dir: Path) -> None:
    """Delete a per-load folder and its owner file (nothing outside `download_dir`)."""
    root = _copy_root(folder, download_dir)
    if root is None:
        return
    shutil.rmtree(root, ignore_errors=True)
    root.with_name(root.name + OWNER_SUFFIX).unlink(missing_ok=True)


def sweep_orphans(download_dir: Path) -> int:
    """Delete the per-load folders of processes on this host that are gone; returns how many."""
    host, removed = socket.gethostname(), 0
    for owner in download_dir.glob(f"*/*{OWNER_SUFFIX}"):
        try:
            owner_host, pid = owner.read_text().split()
            alive = owner_host != host or _alive(int(pid))
        except (OSError, ValueError):
            continue
        if not alive:
            shutil.rmtree(owner.with_name(owner.name.removesuffix(OWNER_SUFFIX)), ignore_errors=True)
            owner.unlink(missing_ok=True)
            removed += 1
    if removed:
        logger.info("removed %d adapter copies left by processes that are gone", removed)
    return removed


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _disk_full(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it: MLflow and shutil wrap the OSError) is a full disk or quota."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        error = todo.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(error) or "Disk quota exceeded" in str(error):
            return True
        todo += [error.__cause__, error.__context__]
    return False


def _check_name(name: str) -> None:
    if not _NAME.match(name):
        raise AdapterRejected(f"version name {name!r} must be letters, digits and ._- (at most 128)")
