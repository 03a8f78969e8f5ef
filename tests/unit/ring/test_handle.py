"""Rank 0's handle on the ring (mlx_ring/ring/handle.py): the serving side knows only the
contract, and both handles shut the ring down alike, through the shared code, each step in
its order. The stage and the wire are recorders; the handles on real stages:
test_lockstep.py, test_scheduler.py."""

import ast

import mlx.core as mx

from mlx_ring.config import ROOT
from mlx_ring.ring.pipeline import Pipeline
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.tensor.lockstep import Lockstep


def test_the_scheduler_runner_and_engine_import_the_contract_not_either_handle():
    for name in ("scheduler", "choosing", "runner", "engine"):
        tree = ast.parse((ROOT / "mlx_ring" / "serving" / f"{name}.py").read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "mlx_ring.ring.handle" in imported, name
        assert not imported & {"mlx_ring.ring.pipeline", "mlx_ring.tensor.lockstep"}, (
            name,
            imported,
        )


class Recorder:
    """Rank 0's stage, its wire to rank 1 and its watch, writing what each
    is asked into `events`."""

    def __init__(self, size: int):
        self.rank, self.size, self.events = 0, size, []

    def apply(self, header: Header, payload):
        self.events.append(("apply", Kind(header.kind).name))
        return mx.array([2.0]) if header.kind == Kind.DECODE else None

    def send(self, header: Header, payload) -> None:
        self.events.append(("send", Kind(header.kind).name))

    def mark(self, event: str, header: Header) -> None:
        if event == "done":
            self.events.append(("done", Kind(header.kind).name))

    def stop(self) -> None:
        self.events.append(("watch stopped",))


def test_lockstep_shuts_down_after_what_is_outstanding_and_stops_its_watch_just_before():
    r = Recorder(size=3)
    pipe = Lockstep(r, r, None)
    pipe.watch = r
    pipe.submit(Header(Kind.PING), None)
    pipe.submit(Header(Kind.DECODE, shape=(1, 1)), mx.array([[7]], dtype=mx.int32), tag="d")
    pipe.shutdown()
    assert r.events == [
        ("send", "PING"),
        ("apply", "PING"),
        ("send", "DECODE"),
        ("apply", "DECODE"),
        # the last decode output, collected lazily, settled first
        ("done", "DECODE"),
        ("watch stopped",),
        ("send", "SHUTDOWN"),
        ("apply", "SHUTDOWN"),
    ]
    assert not pipe.outstanding() and pipe.busy_since is None


def test_a_pipeline_of_one_rank_shuts_down_after_what_is_outstanding_too():
    r = Recorder(size=1)
    pipe = Pipeline(r, r)
    pipe.submit(Header(Kind.PING), None)
    pipe.shutdown()
    assert r.events == [("apply", "PING"), ("apply", "SHUTDOWN")]
    assert not pipe.outstanding()
