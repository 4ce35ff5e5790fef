"""Reading Prometheus text exposition (a ``/metrics`` page) with ``prometheus_client.parser``.

Pure: text in, numbers out; fetching the page is the caller's. One helper for the demo, the
benchmarks and the tests instead of splitting lines by hand.

- :func:`samples` / :func:`value`: samples selected by name and a subset of their labels
  (``value`` sums them, like PromQL's ``sum()`` over the selected series);
- :func:`buckets` and :func:`histogram_quantile`: a histogram's cumulative buckets and a
  quantile from them, interpolated linearly inside a bucket as PromQL's ``histogram_quantile``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = ["MetricNotFound", "buckets", "histogram_quantile", "samples", "value"]


class MetricNotFound(LookupError):
    """No sample has the name and labels asked for; the message names them."""


def samples(text: str, name: str, labels: Mapping[str, str] | None = None) -> list[Sample]:
    """Every sample called ``name`` (the full sample name: ``x_total``, ``x_bucket``) whose labels
    include ``labels``."""
    want = dict(labels or {})
    return [
        s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in want.items())
    ]


def value(text: str, name: str, labels: Mapping[str, str] | None = None, default: float | None = None) -> float:
    """The sum of the selected samples; ``default`` (or :class:`MetricNotFound`) when none match."""
    found = samples(text, name, labels)
    if not found:
        if default is not None:
            return default
        raise MetricNotFound(f"no sample {name}{_selector(labels)} in the exposition")
    return float(sum(s.value for s in found))


def buckets(text: str, name: str, labels: Mapping[str, str] | None = None) -> list[tuple[float, float]]:
    """``(upper bound, cumulative count)`` of histogram ``name`` (without ``_bucket``), sorted;
    series differing in other labels are added up per bound."""
    by_le: dict[float, float] = {}
    for s in samples(text, f"{name}_bucket", labels):
        le = float(s.labels["le"])  # "+Inf" → inf
        by_le[le] = by_le.get(le, 0.0) + s.value
    return sorted(by_le.items())


def histogram_quantile(q: float, cumulative: list[tuple[float, float]]) -> float:
    """PromQL's ``histogram_quantile`` over sorted cumulative buckets; NaN when there are no
    observations. A rank in the ``+Inf`` bucket returns the highest finite bound."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    total = cumulative[-1][1] if cumulative else 0.0
    if total <= 0:
        return math.nan
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in cumulative:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def _selector(labels: Mapping[str, str] | None) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
