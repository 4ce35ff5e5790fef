"""The trainer side's prompt queue with leases: pure (no I/O, no clock, no threads; stdlib only).

A trainer submits a *round* of prompts for one policy version; rollout workers *lease* them,
generate, and *complete* them. What it promises, each counted in :class:`QueueCounters`:

* **none lost**: a leased prompt goes back to the queue when its worker releases it (suspended,
  world change, exiting), when the connection it was leased over closes (the worker died), or
  when the lease expires (``lease_s`` without a completion); requeued prompts are leased again
  before newer ones;
* **none counted twice**: a completion is accepted once per ``(prompt id, policy version)`` —
  the first one wins, whoever sends it (even the worker whose lease expired, if no one else has
  completed it yet); a second is refused as ``duplicate``, one for a version the queue does not
  hold (an older round, an unknown id) as ``stale``;
* per-prompt seeds: :func:`prompt_seed` ``(job seed, prompt id, version)`` — the trainer sets each
  prompt's seed, so which worker draws it changes nothing.

The HTTP service around it: :mod:`rose_sdk.rollout_service`.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SEED_BITS = 63


def prompt_seed(job_seed: int, prompt_id: str, version: int) -> int:
    """The seed of one prompt's sample: a function of the job's seed, the prompt's id and the policy
    version only (sha256, 63 bits), so no worker, batch or arrival order enters it."""
    h = hashlib.sha256(f"{int(job_seed)}\x00{prompt_id}\x00{int(version)}".encode()).digest()
    return int.from_bytes(h[:8], "big") >> (64 - SEED_BITS)


@dataclass(frozen=True)
class Prompt:
    """One prompt of a round: its id (unique within the round), text and the seed to draw it with."""

    id: str
    text: str
    seed: int


@dataclass(frozen=True)
class Lease:
    """A prompt handed to a worker, for the policy ``version``, until ``expires`` (queue time)."""

    prompt: Prompt
    version: int
    worker: str
    conn: int
    expires: float


@dataclass(frozen=True)
class Completion:
    """A worker's answer for ``(prompt_id, version)``: the new tokens and their text."""

    prompt_id: str
    version: int
    token_ids: tuple[int, ...]
    text: str
    worker: str = ""


@dataclass
class QueueCounters:
    """What the queue did, since it was made (all totals)."""

    submitted: int = 0
    leased: int = 0
    accepted: int = 0
    duplicate: int = 0  # completions refused: already accepted for (id, version)
    stale: int = 0  # completions refused: a version or id the queue does not hold
    requeued_release: int = 0  # leases given back by their worker (suspend, world change, exit)
    requeued_disconnect: int = 0  # leases whose connection closed (the worker died)
    requeued_expired: int = 0  # leases that ran out without a completion

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Round:
    version: int
    prompts: dict[str, Prompt]
    done: dict[str, Completion] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.done) == len(self.prompts)


class QueueError(ValueError):
    """Bad use of the queue (a clear one-line message)."""


class PromptQueue:
    """Rounds of prompts, leased to workers. Every method takes the time (``now``, seconds on any
    monotonic clock) where it matters; nothing here reads a clock."""

    def __init__(self, *, lease_s: float = 60.0) -> None:
        if lease_s <= 0:
            raise QueueError(f"lease_s must be > 0, got {lease_s}")
        self.lease_s = lease_s
        self.counters = QueueCounters()
        self._rounds: dict[int, Round] = {}
        self._pending: deque[tuple[int, str]] = deque()  # (version, id), the next to lease first
        self._leases: dict[tuple[int, str], Lease] = {}

    # ------------------------------------------------------------------ trainer side

    def submit(self, version: int, prompts: Sequence[Prompt]) -> None:
        """A round of ``prompts`` for policy ``version`` (ids unique; one open round per version)."""
        if version in self._rounds:
            raise QueueError(f"policy version {version} already has a round")
        ids = [p.id for p in prompts]
        if len(set(ids)) != len(ids):
            raise QueueError(f"prompt ids must be unique within a round: {len(ids) - len(set(ids))} repeated")
        if not prompts:
            raise QueueError("a round needs at least one prompt")
        self._rounds[version] = Round(version, {p.id: p for p in prompts})
        self._pending.extend((version, p.id) for p in prompts)
        self.counters.submitted += len(prompts)

    def round_done(self, version: int) -> bool:
        return self._round(version).complete

    def take(self, version: int) -> dict[str, Completion]:
        """The completed round's completions by prompt id; the round is forgotten (later
        completions for it are ``stale``)."""
        r = self._round(version)
        if not r.complete:
            raise QueueError(f"round {version}: {len(r.prompts) - len(r.done)} of {len(r.prompts)} prompts not done")
        del self._rounds[version]
        return r.done

    def outstanding(self) -> dict[int, int]:
        """Prompts not yet completed, per open version."""
        return {v: len(r.prompts) - len(r.done) for v, r in self._rounds.items() if not r.complete}

    # ------------------------------------------------------------------ worker side

    def lease(self, worker: str, n: int, now: float, *, conn: int = 0) -> list[Lease]:
        """Up to ``n`` prompts for ``worker``, all of one version (the oldest pending), leased until
        ``now + lease_s``; ``conn`` names the connection (its close releases them). Expired leases
        are requeued first."""
        if n < 1:
            raise QueueError(f"lease at least 1 prompt, got {n}")
        self.expire(now)
        out: list[Lease] = []
        while self._pending and len(out) < n:
            version, pid = self._pending[0]
            r = self._rounds.get(version)
            if r is None or pid in r.done or (version, pid) in self._leases:
                self._pending.popleft()  # completed meanwhile (a late answer of an expired lease)
                continue
            if out and version != out[0].version:
                break
            self._pending.popleft()
            lease = Lease(r.prompts[pid], version, worker, conn, now + self.lease_s)
            self._leases[(version, pid)] = lease
            out.append(lease)
        self.counters.leased += len(out)
        return out

    def complete(self, completions: Iterable[Completion]) -> dict[str, int]:
        """Accept each completion once per ``(prompt id, version)``; ``{"accepted", "duplicate",
        "stale"}`` counts for this call."""
        got = {"accepted": 0, "duplicate": 0, "stale": 0}
        for c in completions:
            r = self._rounds.get(c.version)
            if r is None or c.prompt_id not in r.prompts:
                got["stale"] += 1
            elif c.prompt_id in r.done:
                got["duplicate"] += 1
            else:
                r.done[c.prompt_id] = c
                self._leases.pop((c.version, c.prompt_id), None)
                got["accepted"] += 1
        self.counters.accepted += got["accepted"]
        self.counters.duplicate += got["duplicate"]
        self.counters.stale += got["stale"]
        return got

    def release(self, worker: str) -> int:
        """Give back every lease ``worker`` holds (suspend, world change, exit): they go to the
        front of the queue. The number released."""
        n = self._requeue([k for k, ls in self._leases.items() if ls.worker == worker])
        self.counters.requeued_release += n
        return n

    def disconnect(self, conn: int) -> int:
        """The connection ``conn`` closed: its leases go back to the front of the queue."""
        n = self._requeue([k for k, ls in self._leases.items() if ls.conn == conn])
        self.counters.requeued_disconnect += n
        return n

    def expire(self, now: float) -> int:
        """Requeue the leases that ran out by ``now``."""
        n = self._requeue([k for k, ls in self._leases.items() if ls.expires <= now])
        self.counters.requeued_expired += n
        return n

    def leases(self) -> list[Lease]:
        return list(self._leases.values())

    def leases_of(self, worker: str) -> list[Lease]:
        return [ls for ls in self._leases.values() if ls.worker == worker]

    @property
    def leased_now(self) -> int:
        return len(self._leases)

    @property
    def pending_now(self) -> int:
        return sum(self.outstanding().values()) - len(self._leases)

    # ------------------------------------------------------------------ internals

    def _round(self, version: int) -> Round:
        r = self._rounds.get(version)
        if r is None:
            raise QueueError(f"no round for policy version {version}")
        return r

    def _requeue(self, keys: list[tuple[int, str]]) -> int:
        for k in reversed(keys):  # to the front, in their order
            del self._leases[k]
            self._pending.appendleft(k)
        return len(keys)


def completion_from_json(d: Mapping[str, Any], worker: str) -> Completion:
    """A :class:`Completion` from a worker's JSON (``id``, ``version``, ``token_ids``, ``text``);
    a malformed one raises QueueError naming the field."""
    try:
        pid, version, ids, text = d["id"], d["version"], d["token_ids"], d.get("text", "")
    except KeyError as e:
        raise QueueError(f"a completion needs the field {e.args[0]!r}") from None
    if not isinstance(pid, str) or not isinstance(version, int) or isinstance(version, bool):
        raise QueueError("a completion's id must be a string and its version an integer")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise QueueError("a completion's token_ids must be a list of integers")
    if not isinstance(text, str):
        raise QueueError("a completion's text must be a string")
    return Completion(pid, version, tuple(ids), text, worker)
