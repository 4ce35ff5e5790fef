"""Persisted models are unpickled only from a private directory and with the recorded sha256.

Real files in a temporary directory; the "attacker" replaces a model file with a pickle that
runs code on load (it creates a marker file), or makes the directory writable by others.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import time
from pathlib import Path

import pytest

from predictor.generator import generate
from predictor.model import QuantileForecaster
from predictor.series import Series
from predictor.service import PoolConfig, PredictorService, Settings
from predictor.store import ModelStore, UntrustedModel
from tests.support.predictor_fixtures import small_config

POOL = PoolConfig(name="pool-a", query="q", capacity=64)


class _RunsCodeOnLoad:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return (Path.touch, (self.marker,))


class _DownSource:
    def range(self, query: str, start: int, end: int, step: int) -> Series:
        raise AssertionError("not called while constructing")


@pytest.fixture(scope="module")
def model() -> QuantileForecaster:
    return QuantileForecaster(small_config()).fit(generate(days=4, step=600, seed=5))


@pytest.fixture
def saved(tmp_path: Path, model: QuantileForecaster) -> tuple[ModelStore, Path]:
    root = tmp_path / "models"
    store = ModelStore(root)
    version = store.save("pool-a", model, {"fitted_at": time.time()}, now=1_700_000_000)
    return store, root / "pool-a" / f"{version}.pkl"


def test_saved_model_is_private_and_records_its_sha256(saved: tuple[ModelStore, Path]) -> None:
    store, pkl = saved
    assert (store.root.stat().st_mode & 0o777, pkl.parent.stat().st_mode & 0o777) == (0o700, 0o700)
    assert pkl.stat().st_mode & 0o777 == 0o600
    assert len(json.loads(pkl.with_suffix(".json").read_text())["sha256"]) == 64
    assert store.load_latest("pool-a") is not None


def test_a_swapped_model_file_is_not_unpickled(saved: tuple[ModelStore, Path], tmp_path: Path) -> None:
    store, pkl = saved
    marker = tmp_path / "code-ran"
    pkl.write_bytes(pickle.dumps(_RunsCodeOnLoad(marker)))
    with pytest.raises(UntrustedModel, match=r"its sha256 is [0-9a-f]{64}, its metadata records sha256"):
        store.load_latest("pool-a")
    assert not marker.exists()


def test_a_model_without_a_recorded_sha256_is_not_unpickled(saved: tuple[ModelStore, Path], tmp_path: Path) -> None:
    store, pkl = saved
    marker = tmp_path / "code-ran"
    pkl.write_bytes(pickle.dumps(_RunsCodeOnLoad(marker)))
    meta_path = pkl.with_suffix(".json")
    meta_path.write_text(json.dumps({k: v for k, v in json.loads(meta_path.read_text()).items() if k != "sha256"}))
    with pytest.raises(UntrustedModel, match="records no sha256"):
        store.load_latest("pool-a")
    assert not marker.exists()


@pytest.mark.parametrize(
    ("where", "mode", "match"),
    [("root", 0o777, "world-writable"), ("pool", 0o770, "group- or world-writable"), ("pkl", 0o666, "writable")],
)
def test_a_model_dir_others_can_write_is_refused(
    saved: tuple[ModelStore, Path], tmp_path: Path, where: str, mode: int, match: str
) -> None:
    store, pkl = saved
    marker = tmp_path / "code-ran"
    blob = pickle.dumps(_RunsCodeOnLoad(marker))  # re-signed: the sha256 matches, the directory is open
    meta_path = pkl.with_suffix(".json")
    meta_path.write_text(json.dumps({**json.loads(meta_path.read_text()), "sha256": hashlib.sha256(blob).hexdigest()}))
    pkl.write_bytes(blob)
    {"root": store.root, "pool": pkl.parent, "pkl": pkl}[where].chmod(mode)
    with pytest.raises(UntrustedModel, match=f"{match}.*must be private"):
        store.load_latest("pool-a")
    assert not marker.exists()


def test_a_model_owned_by_another_user_is_refused(saved: tuple[ModelStore, Path]) -> None:
    store, pkl = saved
    if os.geteuid() != 0:
        pytest.skip("chown to another uid needs root")
    os.chown(pkl, 12345, 12345)
    with pytest.raises(UntrustedModel, match="owned by uid 12345"):
        store.load_latest("pool-a")


def test_the_service_refits_and_counts_a_refused_model(
    saved: tuple[ModelStore, Path], model: QuantileForecaster
) -> None:
    store, pkl = saved
    settings = Settings(step=600, model=model.config)
    assert PredictorService([POOL], _DownSource(), settings, store).pools["pool-a"].model is not None
    pkl.parent.chmod(0o777)
    svc = PredictorService([POOL], _DownSource(), settings, store)
    assert svc.pools["pool-a"].model is None  # refit at the next refresh
    assert svc.metrics.fits.labels("pool-a", "untrusted")._value.get() == 1
