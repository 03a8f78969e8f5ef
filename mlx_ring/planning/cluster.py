"""The ring as rank 0 serves it: every rank's static facts (gathered from the ranks at startup,
`server.gather_cluster`) and the plan with the planner's predictions, as frozen records; `to_json`
gives what /cluster/status shows. Plain data, no MLX."""

from dataclasses import asdict, dataclass, replace


@dataclass(frozen=True)
class Planned:
    """The planner's view of one rank (a row of `planning/report.summary`, its rank, host and layers
    aside), with what the warm-up measured once it has."""

    device: str = ""
    memory_gb: float = 0.0
    usable_gb: float = 0.0
    tflops: float = 0.0
    bandwidth_gbs: float = 0.0
    capabilities_from: str = ""
    working_set_gb: float = 0.0  # a Mac's recommended working set (0: not a Mac)
    weights_gb: float = 0.0
    needs_gb: float = 0.0
    runtime_gb: float = 0.0
    predicted_stage_ms: float = 0.0
    share: float | None = None  # tensor mode: its share of every layer (None: a pipeline's stage)
    # tensor mode: its part of every layer's KV cache (its KV heads)
    cache_share: float | None = None
    # its prompt cache's RAM tier (None: not planned), and the tokens of its blocks that holds
    prompt_cache_gb: float | None = None
    prompt_cache_tokens: int | None = None
    # its disk tier's write queue and restore staging (None: no disk tier, or not planned)
    disk_queue_gb: float | None = None
    restore_gb: float | None = None
    # its caches for the KV room every rank grants (None: not planned)
    kv_room_gb: float | None = None
    most_gb: float | None = None  # the most it holds: weights, runtime, KV room and prompt cache
    # the warm-up's measure of its activations (None: before it)
    measured_runtime_gb: float | None = None


@dataclass(frozen=True)
class RankFacts:
    """One rank as it reported itself (`Shard.info`), and the planner's view of it."""

    rank: int
    host: str
    layers: tuple[int, int]  # [start, end) of the layers it holds
    parameter_bytes_kib: int = 0
    holds_embedding: bool = False
    holds_head: bool = False
    planned: Planned | None = None  # None: no prediction was made
    # bytes of the fixed states each prompt-cache block keeps beside its positions (-1: unknown)
    state_bytes: int = 0

    @classmethod
    def of(cls, info: dict, planned: dict | None = None) -> "RankFacts":
        """From a rank's `Shard.info()` and its row of the planner's summary (its keys that the
        rank's own facts hold are not taken from the summary)."""
        view = {k: v for k, v in (planned or {}).items() if k not in ("rank", "host", "layers")}
        return cls(
            rank=info["rank"],
            host=info["host"],
            layers=tuple(info["layers"]),
            parameter_bytes_kib=info["parameter_bytes"] >> 10,
            holds_embedding=info["holds_embedding"],
            holds_head=info["holds_head"],
            planned=Planned(**view) if planned is not None else None,
            state_bytes=info.get("state_bytes", 0),
        )

    def to_json(self) -> dict:
        out = {
            "rank": self.rank,
            "host": self.host,
            "layers": list(self.layers),
            "holds_embedding": self.holds_embedding,
            "holds_head": self.holds_head,
            "parameter_bytes_kib": self.parameter_bytes_kib,
        }
        if self.planned is not None:
            out |= {k: v for k, v in asdict(self.planned).items() if v is not None}
        return out


@dataclass(frozen=True)
class Prediction:
    """What the planner predicts of the whole ring."""

    kv_tokens: int  # KV_TOKENS: the context the plan keeps room for on every rank
    # tokens of KV cache every rank holds at once, beside its slice (JSON: kv_capacity_tokens)
    kv_room: int
    predicted_tokens_per_s: float | None
    slowest_stage_ms: float
    allsum_ms_per_token: float | None = None  # tensor mode: the all_sums' share of a token
    mode_reason: str | None = None  # why PARALLEL chose this mode
    modes: dict | None = None  # each mode's predictions, as `planning/auto.py` compares them

    @classmethod
    def of(cls, summary: dict) -> "Prediction":
        """From the planner's summary (`planning/report.summary`)."""
        return cls(
            summary["kv_tokens"],
            summary["kv_capacity_tokens"],
            summary["predicted_tokens_per_s"],
            summary["slowest_stage_ms"],
            summary.get("allsum_ms_per_token"),
            summary.get("mode_reason"),
            summary.get("modes"),
        )


@dataclass(frozen=True)
class PlanFacts:
    """The layer plan the ring runs, and the planner's predictions of it."""

    strategy: str = ""
    n_layers: int = 0
    ranges: tuple[tuple[int, int], ...] = ()
    prediction: Prediction | None = None
    mode: str = "pipeline"  # pipeline | tensor
    tensor: int = 1  # ranks sharing each stage (LayerPlan.tensor)

    def to_json(self) -> dict:
        out = {
            "strategy": self.strategy,
            "mode": self.mode,
            "tensor": self.tensor,
            "n_layers": self.n_layers,
            "ranges": [list(r) for r in self.ranges],
        }
        p = self.prediction
        if p is not None:
            out |= {
                "kv_tokens": p.kv_tokens,
                "kv_capacity_tokens": p.kv_room,
                "predicted_tokens_per_s": p.predicted_tokens_per_s,
                "slowest_stage_ms": p.slowest_stage_ms,
            }
            out |= {
                k: v
                for k, v in (
                    ("allsum_ms_per_token", p.allsum_ms_per_token),
                    ("mode_reason", p.mode_reason),
                    ("modes", p.modes),
                )
                if v is not None
            }
        return out


@dataclass(frozen=True)
class Cluster:
    """The ring's static facts, gathered once at startup."""

    ranks: tuple[RankFacts, ...] = ()
    plan: PlanFacts = PlanFacts()

    @property
    def kv_room(self) -> int | None:
        """Tokens of KV cache every rank holds at once (None: the planner made no prediction)."""
        return self.plan.prediction.kv_room if self.plan.prediction else None

    def with_kv_room(self, kv_room: int) -> "Cluster":
        return replace(
            self, plan=replace(self.plan, prediction=replace(self.plan.prediction, kv_room=kv_room))
        )

    def hosts(self) -> dict[int, str]:
        return {r.rank: r.host for r in self.ranks}

    def to_json(self) -> dict:
        """What /cluster/status shows of the ring: `ranks` (each rank's static facts) and `plan`."""
        return {"ranks": [r.to_json() for r in self.ranks], "plan": self.plan.to_json()}
