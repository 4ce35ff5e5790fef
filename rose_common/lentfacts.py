"""The node facts about lending, as written by the DRA driver (``dra_driver/nodefacts.py``) and
read by anyone who counts a node's lent GPUs: ``rose.io/lent-gpus`` (GPUs lent whole, comma-separated
indexes) and ``rose.io/lent-gpu-shares`` (GPUs lent in RL shares, ``<index>=<fraction>``). A GPU
lent only in shares counts its fraction, not a whole GPU. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from rose_common import names


def format_shares(fractions: Mapping[int, float]) -> str:
    """``{0: 0.4251}`` → ``"0=0.43"`` (rounded up to 0.01, GPUs in index order)."""
    return ",".join(f"{i}={math.ceil(round(f * 100, 6)) / 100:.2f}" for i, f in sorted(fractions.items()))


def parse_shares(raw: str | None) -> dict[int, float]:
    """The reader's side of ``rose.io/lent-gpu-shares``: ``"0=0.43,2=0.10"`` → ``{0: 0.43, 2: 0.1}``;
    ``""`` or None → ``{}``. A malformed entry raises ValueError naming it."""
    out: dict[int, float] = {}
    for part in (raw or "").split(","):
        if not part.strip():
            continue
        index, sep, value = part.partition("=")
        try:
            if not sep:
                raise ValueError("no '='")
            frac = float(value)
            if not 0.0 <= frac <= 1.0:
                raise ValueError("fraction outside 0..1")
            out[int(index)] = frac
        except ValueError as e:
            raise ValueError(
                f"{names.ANNOTATION_LENT_SHARES}: bad entry {part!r} (want <gpu index>=<fraction 0..1>): {e}"
            ) from e
    return out


def lent_gpu_equivalents(annotations: Mapping[str, str]) -> float:
    """GPUs a node has lent, whole GPUs counting 1 and shared GPUs their fraction, from its node
    facts (``rose.io/lent-gpus``, ``rose.io/lent-gpu-shares``)."""
    whole = {p for p in (annotations.get(names.ANNOTATION_LENT) or "").split(",") if p.strip()}
    shares = parse_shares(annotations.get(names.ANNOTATION_LENT_SHARES))
    return len(whole) + sum(f for i, f in shares.items() if str(i) not in whole)
