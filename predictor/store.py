"""Versioned, persisted models: ``<dir>/<pool>/<version>.pkl`` plus ``<version>.json`` metadata.

I/O boundary: the model directory only. Writes are atomic (temporary file, fsync, rename), so a
crash never leaves half a model; the newest ``keep`` versions are kept; directories are created
``0700`` and files ``0600``.

Unpickling runs code, so a model file is loaded only when nobody else could have written it
(:class:`UntrustedModel` otherwise, and the service refits): the model directory, the pool's
directory and both files are owned by this process's user and not group- or world-writable
(:func:`why_not_private`), and the sha256 of the ``.pkl`` equals the one its metadata recorded
at save time. The metadata also records the scikit-learn and numpy versions the model was
pickled with; a model saved under other versions is not loaded (:func:`runtime_mismatch`) but
refit.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictor.model import QuantileForecaster
from rose_common.atomic import atomic_write


def runtime_versions() -> dict[str, str]:
    """The library versions a pickled model depends on."""
    import numpy
    import sklearn

    return {"scikit-learn": sklearn.__version__, "numpy": numpy.__version__}


def runtime_mismatch(meta: dict[str, Any]) -> str | None:
    """Why a model with this metadata must be refit here (None: it may be loaded)."""
    saved = meta.get("runtime")
    now = runtime_versions()
    if saved != now:
        return f"saved with {saved or 'unrecorded library versions'}, running {now}"
    return None


class UntrustedModel(Exception):
    """A persisted model this process will not unpickle: it says why and what to fix."""


def why_not_private(path: Path, uid: int, *, follow: bool = False) -> str | None:
    """Why ``path`` could have been written by someone other than ``uid`` (None: it could not).

    A symbolic link is refused unless ``follow`` (the configured model directory itself).
    """
    st = path.stat() if follow else path.lstat()
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not this process's uid {uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o}); chmod go-w it"
    return None


class ModelStore:
    def __init__(self, root: Path, keep: int = 5) -> None:
        self.root = root
        self.keep = keep

    def save(self, pool: str, model: QuantileForecaster, meta: dict[str, Any], now: float) -> str:
        blob = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S")
        version = f"{pool}-{stamp}-{hashlib.sha256(blob).hexdigest()[:8]}"
        d = self.root / pool
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        d.mkdir(mode=0o700, exist_ok=True)
        atomic_write(d / f"{version}.pkl", blob)
        meta = {**meta, "runtime": runtime_versions(), "sha256": hashlib.sha256(blob).hexdigest()}
        atomic_write(d / f"{version}.json", (json.dumps({"version": version, **meta}, indent=1) + "\n").encode())
        for old in self.versions(pool)[: -self.keep]:
            (d / f"{old}.pkl").unlink(missing_ok=True)
            (d / f"{old}.json").unlink(missing_ok=True)
        return version

    def versions(self, pool: str) -> list[str]:
        """Versions on disk, oldest first (the names sort by time)."""
        d = self.root / pool
        if not d.is_dir():
            return []
        return sorted(p.stem for p in d.glob(f"{pool}-*.pkl") if (d / f"{p.stem}.json").exists())

    def load(self, pool: str, version: str) -> tuple[QuantileForecaster, dict[str, Any]]:
        """Unpickle one version after the checks in the module docstring (UntrustedModel when they fail)."""
        d = self.root / pool
        pkl, sidecar = d / f"{version}.pkl", d / f"{version}.json"
        for path in (self.root, d, pkl, sidecar):
            why = why_not_private(path, os.geteuid(), follow=path == self.root)
            if why is not None:
                raise UntrustedModel(f"not loading {pkl}: {why}; the model directory must be private to the predictor")
        meta: dict[str, Any] = json.loads(sidecar.read_text())
        blob = pkl.read_bytes()
        want, got = meta.get("sha256"), hashlib.sha256(blob).hexdigest()
        if want != got:
            recorded = f"records sha256 {want}" if want else "records no sha256"
            raise UntrustedModel(f"not loading {pkl}: its sha256 is {got}, its metadata {recorded}")
        model = pickle.loads(blob)
        if not isinstance(model, QuantileForecaster):
            raise TypeError(f"{pkl} does not hold a QuantileForecaster")
        return model, meta

    def load_latest(self, pool: str) -> tuple[str, QuantileForecaster, dict[str, Any]] | None:
        versions = self.versions(pool)
        if not versions:
            return None
        model, meta = self.load(pool, versions[-1])
        return versions[-1], model, meta
