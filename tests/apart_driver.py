"""ring_driver.py with each rank's Ring built as the server builds it (RECEIVE_APART from the
environment), noting how every payload arrived: `apart{rank}.json` in the first `--out` folder
counts, per step kind, the payloads received and evaluated apart before the stage was built
("PREFILL apart") and those left unread in the stage's graph ("DECODE in graph")."""

import argparse
import json
from collections import Counter
from pathlib import Path

import ring_driver

from mlx_ring.ring.protocol import Kind
from mlx_ring.ring.transport import Ring


class NotingRing(Ring):
    made: list["NotingRing"] = []

    def __init__(self, world):
        super().__init__(world)
        self.seen: Counter[str] = Counter()
        NotingRing.made.append(self)

    def recv(self, lazy: bool = False):
        header, payload = super().recv(lazy)
        if payload is not None:  # `unread` stays set only for a payload left in the graph
            self.seen[f"{Kind(header.kind).name} {'in graph' if self.unread else 'apart'}"] += 1
        return header, payload


def main():
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--out", nargs="+", required=True)
    out = Path(p.parse_known_args()[0].out[0])
    ring_driver.Ring = NotingRing
    ring_driver.main()
    for ring in NotingRing.made:
        (out / f"apart{ring.rank}.json").write_text(json.dumps(ring.seen))


if __name__ == "__main__":
    main()
