"""Bringing a host up to date from rank 0's machine, over ssh: the project's tracked files
(only those that differ), uv and the locked environment, and the weight pieces of its slice
(only those it lacks, checked against their hashes on arrival). Every step is a no-op when the
host is already current."""

import hashlib
import io
import json
import logging
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

from mlx_ring.hosts import ssh
from mlx_ring.hosts.facts import Facts
from mlx_ring.hosts.weights import MANIFEST, piece_bytes, slice_folder, small_files

log = logging.getLogger("provision")

UV_INSTALLER = "curl -LsSf https://astral.sh/uv/install.sh | sh"

# $1 cache folder (empty: the host's default), $2 the slice's folder name; stdin: a tar of
# blobs/ and hosted/<name>/.
RECEIVE = r"""
set -e
cache=${1:-$HOME/.cache/mlx-ring}; id=$2
mkdir -p "$cache/blobs" "$cache/hosted"
staging=$(mktemp -d "$cache/incoming.XXXXXX")  # pieces land here, are checked, then moved
trap 'rm -rf "$staging"' EXIT
tar -xf - -C "$staging"
for f in "$staging"/blobs/*; do
  [ -e "$f" ] || continue
  sum=$( (sha256sum "$f" 2>/dev/null || shasum -a 256 "$f") | cut -d' ' -f1)
  [ "$sum.safetensors" = "${f##*/}" ] || { echo "weight piece ${f##*/} arrived damaged (sha256 $sum)" >&2; exit 3; }
  mv "$f" "$cache/blobs/"
done
rm -rf "$cache/hosted/$id"
mv "$staging/hosted/$id" "$cache/hosted/$id"
"""


class Counted(io.RawIOBase):
    """A write-only pipe that counts what went through it (and tells `progress`)."""

    def __init__(self, raw, progress=None):
        self.raw, self.bytes, self.progress = raw, 0, progress

    def writable(self):
        return True

    def write(self, b):
        self.raw.write(b)
        self.bytes += len(b)
        if self.progress:
            self.progress(len(b))
        return len(b)


class Chunks(io.RawIOBase):
    """A stream of byte strings as a readable file, for tarfile."""

    def __init__(self, chunks):
        self.chunks, self.left = iter(chunks), b""

    def readable(self):
        return True

    def readinto(self, buf):
        while not self.left:
            self.left = next(self.chunks, None)
            if self.left is None:
                self.left = b""
                return 0
        n = min(len(buf), len(self.left))
        buf[:n], self.left = self.left[:n], self.left[n:]
        return n


def _send_tar(
    conf: Path, host: str, script: str, args: tuple, add, progress=None, via: str | None = None
) -> int:
    """Stream a tar that `add(tar)` fills into `script` on `host` (over `via`, an
    address); the bytes sent."""
    p = subprocess.Popen(
        ssh.argv(conf, host, script, args, via),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    out = Counted(p.stdin, progress)
    try:
        with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tar:
            add(tar)
        p.stdin.close()
    except BrokenPipeError:
        pass
    err = p.stderr.read().decode(errors="replace")
    if p.wait() == 255:
        raise ssh.SshError(ssh.explain(host, err))
    if p.returncode:
        raise ValueError(
            f"{host}: receiving files failed "
            f"({err.strip().splitlines()[-1] if err.strip() else p.returncode}); is its disk full?"
        )
    return out.bytes


# $1 the project's path; stdin: a tar of the files that differ there.
RECEIVE_CODE = r"""
mkdir -p "$1" 2>/dev/null && [ -w "$1" ] || { echo "cannot write $1" >&2; exit 4; }
tar -xf - -C "$1"
"""


def closed_to_ssh_on_macos(root: Path) -> bool:
    """Whether a Mac refuses ssh sessions access to `root` (TCC protects these
    folders of every account)."""
    parts = Path(root).parts
    return (
        len(parts) > 3 and parts[1] == "Users" and parts[3] in ("Documents", "Desktop", "Downloads")
    )


def location_advice(root: Path) -> str:
    return (
        f"the project lives at the same path on every host ({root}): create it there as a folder "
        "your user owns and that ssh may read (on Macs, /Users/Shared/mlx-ring works for every "
        "account name without sudo; not under ~/Documents, ~/Desktop or ~/Downloads, which macOS "
        "privacy controls close to ssh), then clone the project there on this machine too"
    )


def send_code(conf: Path, facts: Facts, root: Path, sums: dict[str, str]) -> tuple[int, list[str]]:
    """The runtime files whose contents differ on the host: (bytes sent, the files it
    had that were replaced)."""
    stale = [f for f, digest in sums.items() if facts.sums.get(f) != digest]
    if not stale:
        return 0, []
    try:
        sent = _send_tar(
            conf,
            facts.host,
            RECEIVE_CODE,
            (root,),
            lambda tar: [tar.add(root / f, arcname=f) for f in stale],
        )
    except ValueError as e:
        if "cannot write" in str(e) or "not permitted" in str(e).lower():
            raise ValueError(
                (
                    f"{facts.host}: cannot write the project's folder {root} there; "
                    f"{location_advice(root)}"
                )
            ) from None
        raise
    return sent, [f for f in stale if f in facts.sums]


def ensure_uv(conf: Path, facts: Facts, here_system: str) -> None:
    """uv on the host: this machine's binary where the OS and CPU match, else astral's installer."""
    if facts.uv:
        return
    mine = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    if facts.system == here_system and Path(mine).is_file():
        with open(mine, "rb") as f:
            ssh.run(
                conf,
                facts.host,
                'mkdir -p "$HOME/.local/bin" && cat > "$HOME/.local/bin/uv.part" && '
                'chmod +x "$HOME/.local/bin/uv.part" && mv '
                '"$HOME/.local/bin/uv.part" "$HOME/.local/bin/uv"',
                stdin=f,
            )
    else:
        p = ssh.run(conf, facts.host, UV_INSTALLER, timeout=300)
        if p.returncode:
            raise ValueError(
                (
                    f"{facts.host}: installing uv failed ({p.stderr.strip()[-200:]}); install it "
                    f"there by hand: {UV_INSTALLER}"
                )
            )


def sync_env(conf: Path, facts: Facts, root: Path) -> None:
    """The locked runtime environment (and, on Linux, OpenBLAS) through the
    host's own `./launch.sh setup`."""
    p = ssh.run(conf, facts.host, 'cd "$1" && ./launch.sh setup', (root,), timeout=900)
    if p.returncode:
        tail = " ".join(p.stderr.strip().splitlines()[-2:])[-300:]
        raise ValueError(
            f"{facts.host}: setting up the environment failed ({tail}); run `./launch.sh setup` in "
            f"{root} there to see why"
        )


def send_pieces(
    conf: Path,
    facts: Facts,
    folder: Path,
    manifest: dict,
    needed: list[str],
    cache: str,
    progress=None,
    via: str | None = None,
) -> int:
    """The weight pieces in `needed` the host lacks, and a folder there that mlx-lm loads, linking
    exactly `needed`; the bytes sent."""
    mid, pieces = manifest["id"], manifest["pieces"]
    send = [g for g in needed if f"{pieces[g]['sha']}.safetensors" not in facts.blobs]
    name = slice_folder(mid, needed)
    hosted = f"hosted/{name}"
    meta = json.dumps(
        {k: manifest[k] for k in ("id", "files", "tensors")}
        | {
            "pieces": {g: {k: p[k] for k in ("sha", "size")} for g, p in pieces.items()},
            "present": needed,
        }
    ).encode()
    if not send and facts.hosted.get(name) == hashlib.sha256(meta).hexdigest():
        return 0  # this slice, as it is, is there already

    def add(tar: tarfile.TarFile):
        for g in send:
            info = tarfile.TarInfo(f"blobs/{pieces[g]['sha']}.safetensors")
            info.size = pieces[g]["size"]
            tar.addfile(info, io.BufferedReader(Chunks(piece_bytes(folder, pieces[g])), 1 << 20))
        for p in small_files(folder):
            tar.add(p, arcname=f"{hosted}/{p.name}")
        for g in needed:
            link = tarfile.TarInfo(f"{hosted}/model-{g}.safetensors")
            link.type, link.linkname = (
                tarfile.SYMTYPE,
                f"../../blobs/{pieces[g]['sha']}.safetensors",
            )
            tar.addfile(link)
        info = tarfile.TarInfo(f"{hosted}/{MANIFEST}")
        info.size = len(meta)
        tar.addfile(info, io.BytesIO(meta))

    return _send_tar(conf, facts.host, RECEIVE, (cache, name), add, progress, via)


def probe(
    conf: Path, host: str, local: bool, root: Path, dtype: str, rank: int, caps_env: str
) -> dict:
    """The host's capabilities, measured there (and cached there) under its rank's setup."""
    script = 'cd "$1" && MLX_RING_CAPS="$4" ./launch.sh probe "$2" "$3"'
    p = ssh.run_on(conf, host, local, script, (root, dtype, rank, caps_env), timeout=300)
    if p.returncode:
        raise ValueError(f"{host}: measuring it failed ({p.stderr.strip()[-300:]})")
    return json.loads(p.stdout.strip().splitlines()[-1])


def timed(fn, *args) -> tuple[object, float]:
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0
