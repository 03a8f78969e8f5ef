"""Tensor mode's header link: a TCP connection of its own from each rank to the next, beside MLX's
ring, that carries the step headers. Payloads stay on MLX's ring.

Why: MLX evaluates the ring backend's send and recv on its CPU stream, and on CUDA such an
evaluation waits for all the GPU work queued before it: a header sent through MLX while the last
step computed took 2.3-5.7 ms of rank 0's thread a step (2 x H100), so rank 0 could not build a step
while the last one ran, as mlx-lm's own loop does; a worker's header recv waited the same way. A
header over a plain socket touches neither MLX nor the GPU.
"""

import socket
import struct

import mlx.core as mx

from mlx_ring.ring.protocol import HEADER_LEN
from mlx_ring.ring.world import split_address

FORMAT = struct.Struct(f"<{HEADER_LEN}i")
ACCEPT_S = 60  # the previous rank connects as soon as it has every rank's port


class HeaderLink:
    """The socket to the next rank (headers go out on it) and the one from the previous rank."""

    def __init__(self, to_next: socket.socket, from_prev: socket.socket, prev: int):
        self.to_next, self.from_prev, self.prev = to_next, from_prev, prev

    @classmethod
    def open(cls, world: mx.distributed.Group, description: list[list[str]]) -> "HeaderLink":
        """Every rank of `world` calls this at the same point of its start. `description`:
        mlx.launch's ring description (per rank, the "ip:port" addresses it listens on); each
        rank listens on its first ring address's IP, on a port the system picks, and tells the
        others in one all_gather."""
        rank, size = world.rank(), world.size()
        nxt, prev = (rank + 1) % size, (rank - 1) % size
        host = split_address(description[rank][0])[0]
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        with listener:
            listener.bind((host, 0))
            listener.listen(1)
            # Every rank listens before any connects: the all_gather returns only
            # once all have bound.
            port = mx.array([listener.getsockname()[1]], dtype=mx.int32)
            ports = (mx.distributed.all_gather(port, group=world) if size > 1 else port).tolist()
            address = (split_address(description[nxt][0])[0], ports[nxt])
            try:
                to_next = socket.create_connection(address, timeout=ACCEPT_S)
            except OSError as e:
                raise RuntimeError(
                    f"rank {rank} could not open its header link to rank {nxt} at {address}: {e}"
                ) from e
            to_next.settimeout(None)
            # a header is one small write
            to_next.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            listener.settimeout(ACCEPT_S)
            try:
                from_prev, _ = listener.accept()
            except OSError as e:
                raise RuntimeError(
                    f"rank {rank}: rank {prev} opened no header link within {ACCEPT_S} s: {e}"
                ) from e
        from_prev.settimeout(None)
        return cls(to_next, from_prev, prev)

    def fileno(self) -> int:
        """The socket the previous rank's headers arrive on (to wait on with select)."""
        return self.from_prev.fileno()

    def send(self, ints: tuple[int, ...]) -> None:
        try:
            self.to_next.sendall(FORMAT.pack(*ints))
        except OSError as e:  # as MLX's ring backend reports a lost peer
            raise RuntimeError(f"the next rank closed its header link: {e}") from e

    def recv(self) -> tuple[int, ...]:
        """The next header's fields, once all its bytes came; RuntimeError if the previous rank
        closed the link."""
        data = b""
        while len(data) < FORMAT.size:
            try:
                part = self.from_prev.recv(FORMAT.size - len(data))
            except OSError as e:
                raise RuntimeError(f"rank {self.prev}'s header link failed: {e}") from e
            if not part:
                raise RuntimeError(f"rank {self.prev} closed its header link")
            data += part
        return FORMAT.unpack(data)

    def close(self) -> None:
        self.to_next.close()
        self.from_prev.close()
