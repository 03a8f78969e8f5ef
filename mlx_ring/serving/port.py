"""What the HTTP side may ask of rank 0's engine, and the values that travel between them: requests
in, events out, one stats snapshot. Plain data, no MLX: the API imports only this, and its tests
serve it with a stand-in engine."""

import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Protocol

from mlx_ring.serving.params import SamplingParams

# Upper bounds (seconds) of the ring-step histogram the engine keeps (Prometheus' `le`).
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


@dataclass
class Started:
    """The prompt's prefill has begun; nothing is generated yet."""

    cached_tokens: int = 0  # of the prompt's tokens, those the prompt cache held


@dataclass
class Delta:
    text: str
    tokens: list  # serving.sampling.Token: id, logprob, top alternatives
    # of the prompt's tokens, those the prompt cache held (known once its prefill began)
    cached_tokens: int = 0


@dataclass
class Done:
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int
    # of the prompt's tokens, those the prompt cache held (not computed again)
    cached_tokens: int = 0
    stop_sequence: str | None = None  # the stop string that ended the answer, if one did


@dataclass
class Failed:
    message: str
    status: int = 500
    type: str = "server_error"


@dataclass(eq=False)
class Request:
    prompt: list[int]
    max_tokens: int
    params: SamplingParams
    # called on the engine thread; must not block. Started (at most once), Delta..., then Done or
    # Failed
    emit: Callable[[Started | Delta | Done | Failed], None]
    stop: list[str] = field(default_factory=list)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # another choice of the same prompt: start from its cached prompt
    after: "Request | None" = None
    sequence: object = None  # the engine's scheduler.Sequence, once admitted


class QueueFull(Exception):
    pass


class Unavailable(Exception):
    """The engine takes no new work: it is draining for shutdown, or the ring is broken."""


@dataclass(frozen=True)
class PromptCacheStats:
    entries: int
    tokens: int
    budget_tokens: int
    hits: int
    hit_tokens: int  # prompt tokens not prefilled thanks to the cache, since the start
    block: int = 0  # tokens a block holds
    disk_hit_tokens: int = 0  # of the hit tokens, those read back from the ranks' disks
    # rank 0's disk tier (None: off): blocks, bytes, cap_bytes, written_bytes, ... (cache/disk.py)
    disk: dict | None = None


@dataclass(frozen=True)
class PrefillProgress:
    """One prompt prefilling now: of its `tokens`, `done` are in the KV cache of every rank, the
    `cached` start the prompt cache held included."""

    tokens: int
    done: int
    cached: int


@dataclass(frozen=True)
class Stats:
    """Rank 0's engine at one moment: what /metrics, /cluster/status and the page show of it."""

    queued: int  # requests waiting for a place
    active: int  # sequences generating
    broken: str | None  # why the ring is unusable, else None
    stopping: bool  # draining for shutdown
    prompt_cache: PromptCacheStats | None  # None: no prompt cache
    draft_tokens: int  # most tokens drafted a step (0: no speculative decoding)
    drafted: int  # draft tokens verified, since the start
    accepted: int  # draft tokens kept, since the start
    # ring steps per STEP_BUCKETS bucket (not cumulative), the last one past them all
    step_counts: tuple[int, ...]
    step_seconds: float  # time of all ring steps
    # sequences whose prompt has not started: waiting for a prefill turn or for room in the KV cache
    waiting: int = 0
    prefills: tuple[PrefillProgress, ...] = ()  # the prompts prefilling now, oldest first

    @property
    def serving(self) -> bool:
        return self.broken is None and not self.stopping


class EnginePort(Protocol):
    """The engine as the routes see it; every method is safe to call from the HTTP thread."""

    def submit(self, *reqs: Request) -> None:
        """Queue the choices of one API request, all or none; QueueFull or Unavailable otherwise.
        Events come back through each request's `emit`: Started once its prefill begins, then its
        text, ending with Done or Failed."""

    def cancel(self, *reqs: Request) -> None:
        """The client has gone: stop and free these requests (a no-op for finished ones)."""

    def stats(self) -> Stats:
        """A snapshot of the engine's own figures; no trip round the ring."""

    def ping(self) -> Future:
        """A trip round every rank between generation steps; resolves to one dict per rank
        (memory, open sequences, cached tokens, stage and busy time), or fails with the ring."""
