"""Who runs the rollout: exactly one controller holds the lease, the others stand by.

- `FileLease`: an exclusive `flock` on a file, for processes of one machine. The kernel releases it
  when the holder dies (even by SIGKILL), so a standby takes over at its next try.
- `KubernetesLease`: a `coordination.k8s.io/v1` Lease, as Kubernetes' own controllers elect their
  leader. The holder renews `renewTime`; a candidate takes the Lease once it has not been renewed for
  `leaseDurationSeconds`. Every write carries the `resourceVersion` it read, so of two candidates
  only one wins (the API server refuses the other with 409). A holder that cannot renew stops acting
  (its `acquire` answers False) before the others may take over.

`acquire()` is called periodically: it takes the lease, or renews it, and says whether this process
holds it now.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from online_rl.errors import ConfigError

__all__ = ["FileLease", "KubernetesLease", "Lease", "make_lease"]

logger = logging.getLogger(__name__)
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class Lease(Protocol):
    identity: str

    def acquire(self) -> bool: ...

    def release(self) -> None: ...


class FileLease:
    def __init__(self, path: Path, identity: str) -> None:
        self.path, self.identity = Path(path), identity
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd: int | None = None

    def acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{self.identity}\n".encode())
        self._fd = fd
        return True

    def holder(self) -> str | None:
        try:
            return self.path.read_text().strip() or None
        except OSError:
            return None

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class KubernetesLease:
    """A Lease in `namespace`, through the API server at `api` with a bearer `token`."""

    def __init__(self, name: str, namespace: str, identity: str, duration_s: float, api: str, token: str,
                 verify: str | bool = True, clock: Any = time.time,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.name, self.namespace, self.identity, self.duration_s = name, namespace, identity, duration_s
        self._client = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {token}"}, verify=verify,
                                    timeout=max(1.0, duration_s / 3), transport=transport)
        # Another holder's lease lapses by this process's clock, as client-go judges it: from when this
        # process last saw the Lease change (holder or resourceVersion), not from the holder's renewTime,
        # so that clocks that differ between machines cannot hand over a live lease.
        self._seen: tuple[str | None, str] | None = None
        self._seen_at = 0.0
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self._clock = clock

    @classmethod
    def in_cluster(cls, name: str, identity: str, duration_s: float) -> KubernetesLease:
        host = os.environ.get("KUBERNETES_SERVICE_HOST")
        port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host or not (SERVICE_ACCOUNT / "token").is_file():
            raise ConfigError("gateway.election is kubernetes, but this is not a pod with a service account "
                              "token; use election: file outside Kubernetes")
        namespace = (SERVICE_ACCOUNT / "namespace").read_text().strip()
        return cls(name, namespace, identity, duration_s, f"https://{host}:{port}",
                   (SERVICE_ACCOUNT / "token").read_text().strip(), str(SERVICE_ACCOUNT / "ca.crt"))

    def _body(self, resource_version: str | None, acquired: str | None, transitions: int) -> dict[str, Any]:
        now = _stamp(self._clock())
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if resource_version is not None:
            metadata["resourceVersion"] = resource_version
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata,
                "spec": {"holderIdentity": self.identity,
                         "leaseDurationSeconds": max(1, round(self.duration_s)),
                         "acquireTime": acquired or now, "renewTime": now, "leaseTransitions": transitions}}

    def acquire(self) -> bool:
        """Take or renew the lease. Any failure (the API server away, another writer first) answers
        False, and the caller stops acting at once: renewing every third of the duration, it stops
        well before another candidate may take the lease over."""
        try:
            return self._acquire()
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            logger.warning("the controller lease could not be read or written: %s", exc)
            return False

    def _acquire(self) -> bool:
        got = self._client.get(f"{self._path}/{self.name}")
        if got.status_code == 404:
            created = self._client.post(self._path, json=self._body(None, None, 0))
            return created.status_code in (200, 201)
        got.raise_for_status()
        lease = got.json()
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity")
        version = lease["metadata"]["resourceVersion"]
        transitions = int(spec.get("leaseTransitions") or 0)
        if (holder, version) != self._seen:
            self._seen, self._seen_at = (holder, version), self._clock()
        if holder == self.identity:
            body = self._body(version, spec.get("acquireTime"), transitions)
        else:
            duration = float(spec.get("leaseDurationSeconds") or self.duration_s)
            if holder and self._clock() - self._seen_at < duration:
                return False  # held by a controller that renewed within the duration, as seen from here
            body = self._body(version, None, transitions + 1)
        put = self._client.put(f"{self._path}/{self.name}", json=body)
        if put.status_code == 409:  # another candidate wrote first
            return False
        put.raise_for_status()
        return True

    def release(self) -> None:
        """Give the lease up (an orderly stop): the next candidate takes it at once."""
        try:
            got = self._client.get(f"{self._path}/{self.name}")
            lease = got.json() if got.status_code == 200 else {}
            if (lease.get("spec") or {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = None
                self._client.put(f"{self._path}/{self.name}", json=lease)
        except (httpx.HTTPError, ValueError) as exc:
            logger.warning("could not release the controller lease: %s", exc)


def make_lease(election: str, lock_file: Path, name: str, identity: str, duration_s: float) -> Lease:
    """The lease `election` names (auto: Kubernetes inside a pod, else a lock on `lock_file`)."""
    if election == "auto":
        election = "kubernetes" if os.environ.get("KUBERNETES_SERVICE_HOST") else "file"
    if election == "kubernetes":
        return KubernetesLease.in_cluster(name, identity, duration_s)
    return FileLease(lock_file, identity)
