"""Run under mlx.launch on 2 ranks by tests/ring/test_deadline_ring.py: rank 1 serves as a JACCL
worker does, its waits timed (deadlines of 2 s), while rank 0 sends a step's header and then
falls silent before its payload, as a Mac stopped mid-step would. Rank 1 must leave by itself,
naming rank 0."""

import time

import mlx.core as mx

from mlx_ring.ring.deadline import Deadlines
from mlx_ring.ring.protocol import Header, Kind
from mlx_ring.ring.transport import Ring
from mlx_ring.ring.world import init_world

world = init_world()
if world.rank() == 0:
    ring = Ring(world, frozenset())
    payload = mx.zeros((1, 1, 8))
    ring.send_header(Header.for_payload(Kind.DECODE, payload), payload)
    time.sleep(120)  # silent: no payload follows
else:
    deadlines = Deadlines(2.0)
    ring = Ring(world, frozenset({"DECODE", "PREFILL"}), deadlines, hosts=["mac-a", "mac-b"])
    deadlines.start(quiet=30)
    ring.recv(lazy=True)
    time.sleep(120)  # not reached: the payload never comes
