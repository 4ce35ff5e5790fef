"""Client of the predictor's forecasts: two named backends, a timeout, and a cache refreshed in the background.

I/O boundary: HTTP GETs to the predictor (``http``) or reads of one JSON file (``static-file``),
both on the refresher's thread; :meth:`ForecastCache.get` never does I/O. Shared by every
component that consults forecasts (the scheduler extender, the ElasticRLJob controller); each
reduces a :class:`~rose_common.forecast_api.ForecastResponse` to what its own decisions need.

- ``http``: the predictor's ``GET {url}/v1/forecast?pool=P&horizon=10m,30m,60m``
  (reply: :class:`rose_common.forecast_api.ForecastResponse`), each call bounded by a timeout;
- ``static-file``: forecasts read from a JSON file (a list of ForecastResponse objects, or
  ``{"forecasts": [...]}``), re-read when it changes. For operators who want to pin a forecast
  and for tests without a predictor.

Consumers given ``--risk`` read each reply at that risk when it carries it
(:func:`rose_common.forecast_risk.at_risk`), at ``--quantile`` otherwise.

A pool without a fresh forecast (none fetched yet, or older than ``max_age_s``) reads as
``None``: the caller applies its conservative fallback and counts it. Each fetch is reported to
``on_fetch`` as ``"ok"`` or ``"error"`` for the caller's metric.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from pydantic import TypeAdapter, ValidationError

from rose_common.cli import duration
from rose_common.forecast_api import ForecastResponse
from rose_common.forecast_risk import at_risk, risk_key

__all__ = [
    "BACKENDS",
    "HORIZONS",
    "ForecastCache",
    "ForecastError",
    "ForecastSource",
    "HttpForecastSource",
    "StaticFileForecastSource",
    "at_risk",
    "make_source",
    "risk_key",
]

log = logging.getLogger(__name__)

HORIZONS = "10m,30m,60m"
BACKENDS = ("http", "static-file", "none")
T = TypeVar("T")


class ForecastError(Exception):
    """A backend could not produce a forecast (timeout, bad reply, missing pool)."""


class ForecastSource(Protocol):
    name: str

    def fetch(self, pool: str) -> ForecastResponse:
        """The latest forecast for ``pool``; raises :class:`ForecastError`."""
        ...


class HttpForecastSource:
    name = "http"

    def __init__(self, base_url: str, timeout_s: float, horizons: str = HORIZONS) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"predictor URL must start with http:// or https://, got {base_url!r}")
        self._base = base_url.rstrip("/")
        self._timeout = timeout_s
        self._horizons = horizons

    def fetch(self, pool: str) -> ForecastResponse:
        query = urllib.parse.urlencode({"pool": pool, "horizon": self._horizons})
        url = f"{self._base}/v1/forecast?{query}"
        try:
            with urllib.request.urlopen(url, timeout=self._timeout) as resp:
                body = resp.read(8 * 1024 * 1024)
        except (urllib.error.URLError, TimeoutError, OSError) as err:
            raise ForecastError(f"GET {url}: {err}") from err
        try:
            return ForecastResponse.model_validate_json(body)
        except ValidationError as err:
            raise ForecastError(f"GET {url}: reply is not a ForecastResponse: {err}") from err


_LIST = TypeAdapter(list[ForecastResponse])


class StaticFileForecastSource:
    """Forecasts from a JSON file; the file is re-read when its mtime changes."""

    name = "static-file"

    def __init__(self, path: Path) -> None:
        self._path = path
        self._mtime: float | None = None
        self._by_pool: dict[str, ForecastResponse] = {}
        self._lock = threading.Lock()

    def _load(self) -> None:
        try:
            mtime = os.stat(self._path).st_mtime
        except OSError as err:
            raise ForecastError(f"forecast file {self._path}: {err}") from err
        if mtime == self._mtime:
            return
        try:
            raw = json.loads(self._path.read_bytes())
            items = raw.get("forecasts") if isinstance(raw, dict) else raw
            parsed = _LIST.validate_python(items)
        except (OSError, ValueError, ValidationError) as err:
            raise ForecastError(
                f"forecast file {self._path}: expected a JSON list of ForecastResponse "
                f'objects or {{"forecasts": [...]}}: {err}'
            ) from err
        self._by_pool = {f.pool: f for f in parsed}
        self._mtime = mtime

    def check(self) -> None:
        """Read the file now; raises :class:`ForecastError` saying what is wrong with it."""
        with self._lock:
            self._load()

    def fetch(self, pool: str) -> ForecastResponse:
        with self._lock:
            self._load()
            try:
                return self._by_pool[pool]
            except KeyError:
                raise ForecastError(f"forecast file {self._path} has no pool {pool!r}") from None


class ForecastCache(Generic[T]):
    """Non-blocking reads of per-pool forecasts, refreshed in the background.

    Each reply is stored as ``reduce(reply)``. A cached forecast is used for ``max_age_s`` after
    it was fetched; after that (or when none was ever fetched) :meth:`get` returns ``None`` and
    the caller falls back.
    """

    def __init__(
        self,
        source: ForecastSource,
        *,
        reduce: Callable[[ForecastResponse], T],
        refresh_s: float,
        max_age_s: float,
        on_fetch: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self._reduce = reduce
        self._refresh_s = refresh_s
        self._max_age_s = max_age_s
        self._on_fetch = on_fetch or (lambda result: None)
        self._clock = clock
        self._entries: dict[str, tuple[float, T]] = {}
        self._pools: set[str] = set()
        self._attempted: set[str] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, pool: str) -> T | None:
        entry = self._entries.get(pool)
        if pool not in self._pools:
            self._pools.add(pool)
            self._wake.set()
        if entry is None:
            return None
        fetched_at, forecast = entry
        if self._clock() - fetched_at > self._max_age_s:
            return None
        return forecast

    def want(self, pools: Iterable[str]) -> None:
        new = set(pools) - self._pools
        if new:
            self._pools |= new
            self._wake.set()

    def attempted(self, pools: Iterable[str]) -> bool:
        """Whether every one of ``pools`` has been fetched at least once (successfully or not):
        a caller that waits for this never decides on a pool merely because nobody asked yet."""
        return set(pools) <= self._attempted

    def refresh_once(self) -> None:
        for pool in sorted(self._pools):
            try:
                resp = self.source.fetch(pool)
            except ForecastError as err:
                self._attempted.add(pool)
                self._on_fetch("error")
                log.warning(
                    "forecast fetch failed",
                    extra={"pool": pool, "backend": self.source.name, "err": str(err)},
                )
                continue
            self._entries[pool] = (self._clock(), self._reduce(resp))
            self._attempted.add(pool)
            self._on_fetch("ok")

    def _run(self) -> None:
        while not self._stop.is_set():
            self.refresh_once()
            self._wake.wait(self._refresh_s)
            self._wake.clear()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="forecast-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def make_source(
    backend: str, *, url: str = "", path: str = "", timeout_s: float = 0.5, horizons: str = HORIZONS
) -> ForecastSource | None:
    """The named backend (``None`` for ``none``); raises ``ValueError`` saying what is missing."""
    if backend == "none":
        return None
    if backend == "http":
        if not url:
            raise ValueError("forecast backend http needs the predictor URL")
        return HttpForecastSource(url, timeout_s=timeout_s, horizons=horizons)
    if backend == "static-file":
        if not path:
            raise ValueError("forecast backend static-file needs the forecast file")
        return StaticFileForecastSource(Path(path))
    raise ValueError(f"unknown forecast backend {backend!r}: use one of {', '.join(BACKENDS)}")


def _horizons_flag(text: str) -> str:
    parts = [x.strip() for x in text.split(",") if x.strip()]
    if not parts or not all(re.fullmatch(r"[0-9]+[smhdw]?", x) for x in parts):
        raise argparse.ArgumentTypeError(f"--forecast-horizons {text!r}: give durations such as 10m,30m,60m")
    return ",".join(parts)


def _risk_flag(text: str) -> str:
    try:
        return risk_key(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_flags(p: Any, *, without: str) -> None:
    """The forecast flags every consumer shares, on a :class:`rose_common.cli.EnvArgumentParser`
    (``without``: what the component does with the ``none`` backend)."""
    p.flag(
        "--forecast-backend",
        default="http",
        choices=list(BACKENDS),
        help=f"where forecasts come from: http (the predictor), static-file, or none ({without})",
    )
    p.flag("--predictor-url", default="", help="predictor base URL for the http backend, e.g. http://predictor:8080")
    p.flag(
        "--forecast-horizons",
        default=HORIZONS,
        type=_horizons_flag,
        help="horizons the http backend asks the predictor for (a time-compressed soak asks for seconds)",
    )
    p.flag("--forecast-file", default="", help="JSON file of ForecastResponse objects for the static-file backend")
    p.flag(
        "--risk",
        default="",
        type=_risk_flag,
        help="target risk, e.g. 0.01: use the GPUs serving may need over each window at that risk "
        "(gpus_needed) when the forecast carries it, else --quantile (empty: always --quantile)",
    )
    p.flag("--forecast-timeout", default=0.5, type=duration, help="seconds one forecast fetch may take")
    p.flag("--forecast-refresh", default=30.0, type=duration, help="seconds between background forecast refreshes")
    p.flag("--forecast-max-age", default=300.0, type=duration, help="seconds a fetched forecast stays usable")
