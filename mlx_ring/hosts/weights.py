"""A model's weights as content-addressed pieces: one safetensors file per layer, one for the ends
(embedding, final norm, head). A host is sent the pieces of its slice, keeps them under their
hashes, and gets a folder mlx-lm can load that links only those (a "hosted" folder).

The manifest (hashes, sizes, which tensor lives where) is computed once per model folder, reading
every weight byte once, and cached. Its `id` names the model's exact contents: ranks compare ids
before they serve, so two hosts can never serve different weights under one name.
"""

import hashlib
import json
import os
import struct
from pathlib import Path

from mlx_ring.planning.sizes import LAYER_KEY

# in a hosted folder: the whole model's manifest and what is present
MANIFEST = "ring-manifest.json"
CHUNK = 8 << 20


def piece_of(tensor: str) -> str:
    m = LAYER_KEY.search(tensor)
    return f"layer-{int(m.group(1)):05d}" if m else "ends"


def pieces_for(layers: range, ends: bool) -> list[str]:
    """The pieces a rank holding `layers` (and, on rank 0 or in tensor mode, the ends) needs."""
    return [f"layer-{i:05d}" for i in layers] + (["ends"] if ends else [])


def _header(path: Path) -> tuple[int, dict]:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return 8 + n, json.loads(f.read(n))


def _piece_header(tensors: list[list]) -> bytes:
    """The safetensors header of a piece: its tensors back to back, padded to 8 bytes
    as the format asks."""
    head, at = {}, 0
    for _, name, dtype, shape, begin, end in tensors:
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [at, at + end - begin]}
        at += end - begin
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def piece_bytes(folder: Path, piece: dict):
    """The piece's file, as a stream of byte strings (written nowhere on this machine)."""
    yield _piece_header(piece["tensors"])
    for file, _, _, _, begin, end in piece["tensors"]:
        with open(Path(folder) / file, "rb") as f:
            base, _ = _header(Path(folder) / file)
            f.seek(base + begin)
            left = end - begin
            while left:
                chunk = f.read(min(CHUNK, left))
                assert chunk, f"{file} is shorter than its header says"
                left -= len(chunk)
                yield chunk


def weight_files(folder: Path) -> list[Path]:
    return sorted(Path(folder).glob("model*.safetensors"))  # what mlx-lm's load_model reads


def small_files(folder: Path) -> list[Path]:
    """Config, tokenizer, chat template: every plain file that is not a weight file or ours."""
    return sorted(
        p
        for p in Path(folder).iterdir()
        if p.is_file()
        and not p.name.endswith(".safetensors")
        and not p.name.endswith(".safetensors.index.json")
        and p.name != MANIFEST
    )


def build_manifest(folder: Path) -> dict:
    folder = Path(folder)
    tensors, grouped = {}, {}
    for f in weight_files(folder):
        _, head = _header(f)
        for name, v in sorted(
            head.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1
        ):
            if name == "__metadata__":
                continue
            begin, end = v["data_offsets"]
            tensors[name] = [v["dtype"], end - begin]
            grouped.setdefault(piece_of(name), []).append(
                [f.name, name, v["dtype"], v["shape"], begin, end]
            )
    pieces = {}
    for group, items in sorted(grouped.items()):
        piece = {"tensors": items}
        h, size = hashlib.sha256(), 0
        for chunk in piece_bytes(folder, piece):
            h.update(chunk)
            size += len(chunk)
        pieces[group] = {"sha": h.hexdigest(), "size": size, "tensors": items}
    files = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in small_files(folder)}
    ident = hashlib.sha256(
        json.dumps([files, {g: p["sha"] for g, p in pieces.items()}], sort_keys=True).encode()
    )
    return {"id": ident.hexdigest()[:24], "files": files, "tensors": tensors, "pieces": pieces}


def manifest(folder: Path, cache_dir: Path) -> dict:
    """The folder's manifest: the one a hosted folder carries, else computed once and cached by the
    weight files' names, sizes and modification times."""
    folder = Path(folder).resolve()
    own = folder / MANIFEST
    if own.is_file():
        return json.loads(own.read_text())
    stamp = [
        (p.name, p.stat().st_size, p.stat().st_mtime_ns)
        for p in weight_files(folder) + small_files(folder)
    ]
    key = hashlib.sha256(json.dumps([str(folder), stamp]).encode()).hexdigest()[:24]
    cached = Path(cache_dir) / "manifests" / f"{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    m = build_manifest(folder)
    cached.parent.mkdir(parents=True, exist_ok=True)
    tmp = cached.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(m))
    tmp.replace(cached)
    return m


def missing_pieces(folder: Path, needed: list[str]) -> list[str]:
    """Pieces of `needed` a hosted folder lacks (none for an ordinary model
    folder: it holds all)."""
    own = Path(folder) / MANIFEST
    if not own.is_file():
        return []
    present = set(json.loads(own.read_text()).get("present", []))
    return [p for p in needed if p not in present]


def slice_folder(model_id: str, needed: list[str]) -> str:
    """The hosted folder's name for a slice: one per set of pieces, so a host that held another
    rank's slice, or hosts that share a home folder, keep each slice apart."""
    return f"{model_id}-{hashlib.sha256(' '.join(sorted(needed)).encode()).hexdigest()[:12]}"


def find_slice(cache_dir: Path, model_id: str, needed: list[str]) -> Path | None:
    """A hosted folder of `model_id` that holds every piece of `needed` (this rank's slice for this
    plan), whatever else the cache holds; None if there is none."""
    for m in sorted((Path(cache_dir) / "hosted").glob(f"{model_id}*/{MANIFEST}")):
        try:
            meta = json.loads(m.read_text())
        except (OSError, ValueError):
            continue
        if meta.get("id") == model_id and set(needed) <= set(meta.get("present", [])):
            return m.parent
    return None
