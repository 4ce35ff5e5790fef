"""Versioned, persisted models: ``<dir>/<pool>/<version>.pkl`` plus ``<version>.json`` metadata.

Writes are atomic (temporary file, fsync, rename), so a crash never leaves half a model; the
newest ``keep`` versions are kept. Only files this process wrote are ever loaded (pickle).
"""

from __future__ import annotations

import hashlib
import json
import pickle
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from predictor.model import QuantileForecaster
from rose_common.atomic import atomic_write


class ModelStore:
    def __init__(self, root: Path, keep: int = 5) -> None:
        self.root = root
        self.keep = keep

    def save(self, pool: str, model: QuantileForecaster, meta: dict[str, Any], now: float) -> str:
        blob = pickle.dumps(model, protocol=pickle.HIGHEST_PROTOCOL)
        stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%S")
        version = f"{pool}-{stamp}-{hashlib.sha256(blob).hexdigest()[:8]}"
        d = self.root / pool
        atomic_write(d / f"{version}.pkl", blob)
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
        d = self.root / pool
        model = pickle.loads((d / f"{version}.pkl").read_bytes())
        if not isinstance(model, QuantileForecaster):
            raise TypeError(f"{d / version}.pkl does not hold a QuantileForecaster")
        meta: dict[str, Any] = json.loads((d / f"{version}.json").read_text())
        return model, meta

    def load_latest(self, pool: str) -> tuple[str, QuantileForecaster, dict[str, Any]] | None:
        versions = self.versions(pool)
        if not versions:
            return None
        model, meta = self.load(pool, versions[-1])
        return versions[-1], model, meta
