"""ElasticRLJob objects as a user writes them, for every tier: ``apiVersion`` and ``kind`` from
``rose_common.names``, the metadata and the spec exactly as given (no defaults added, so a test
still says every field it relies on). There is no product-level builder to reuse: the demo's
``rose_cli.demo_elastic.job_manifest`` writes one fixed job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rose_common import names


def elastic_rl_job(
    name: str, namespace: str | None = None, meta: Mapping[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    """``{"apiVersion", "kind", "metadata": {name, namespace?, **meta}, "spec": spec}``; the spec's
    keys are the CRD's own (``minGPUs=2, maxGPUs=4, template=...``)."""
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    metadata.update(meta or {})
    return {"apiVersion": names.API_VERSION, "kind": names.KIND, "metadata": metadata, "spec": dict(spec)}
