"""What the launcher needs to know about a host before it starts a rank there, read by one small
POSIX sh script (run over ssh, or here for this machine's own ranks): name, OS, addresses, memory,
whether the checkout and its environment exist, their versions, and which weight pieces it holds."""

from dataclasses import dataclass, field
from pathlib import Path

from mlx_ring.hosts import ssh

# $1 project path, $2 cache folder (empty: the default under that host's home); stdin: the project's tracked files, one per line (hashed there).
SCRIPT = r'''
root=$1; cache=${2:-$HOME/.cache/mlx-ring}
echo "hostname=$(hostname)"
echo "system=$(uname -s) $(uname -m)"
if [ -f /proc/meminfo ]; then
  echo "memory_kib=$(awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print t" "a}' /proc/meminfo)"
else
  pg=$(vm_stat | awk '/page size of/{print $8}')
  free=$(vm_stat | awk '/Pages (free|inactive|speculative|purgeable)/{gsub(/\./,"",$NF); s+=$NF} END{print s}')
  echo "memory_kib=$(( $(sysctl -n hw.memsize) / 1024 )) $(( free * pg / 1024 ))"
fi
echo "addresses=$( (ip -o -4 addr show 2>/dev/null | awk '{split($4,a,"/"); print a[1]}'; ifconfig 2>/dev/null | awk '$1=="inet"{print $2}') | sort -u | tr '\n' ' ')"
u=$(command -v uv 2>/dev/null || { [ -x "$HOME/.local/bin/uv" ] && echo "$HOME/.local/bin/uv"; })
echo "uv=$u"
[ -f /usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 ] || [ -f /usr/lib/aarch64-linux-gnu/openblas-pthread/libblas.so.3 ] && echo "openblas=yes"
if [ -f "$root/launch.sh" ]; then
  echo "checkout=yes"
  if [ -x "$root/.venv/bin/python" ]; then
    echo "versions=$("$root/.venv/bin/python" -c 'import importlib.metadata as m; print(m.version("mlx"), m.version("mlx-lm"))' 2>/dev/null)"
  fi
  echo "sums<<"
  cd "$root" && tr '\n' '\0' | xargs -0 sh -c 'for f; do [ -f "$f" ] && echo "$f"; done' sh | tr '\n' '\0' | xargs -0 sh -c '(sha256sum "$@" 2>/dev/null || shasum -a 256 "$@")' sh
  echo ">>"
fi
echo "blobs=$(ls "$cache/blobs" 2>/dev/null | tr '\n' ' ')"
for m in "$cache"/hosted/*/ring-manifest.json; do
  [ -f "$m" ] && echo "hosted=$(basename "$(dirname "$m")") $( (sha256sum "$m" 2>/dev/null || shasum -a 256 "$m") | cut -d' ' -f1)"
done
'''


@dataclass
class Facts:
    host: str  # as ssh names it
    hostname: str = ""
    system: str = ""
    memory_gb: float = 0.0
    free_gb: float = 0.0
    addresses: tuple[str, ...] = ()
    uv: str = ""
    openblas: bool = False
    checkout: bool = False
    versions: str = ""  # "mlx mlx-lm", empty without an environment
    sums: dict = field(default_factory=dict)  # tracked file -> sha256 there
    blobs: set = field(default_factory=set)  # weight pieces it holds, by file name
    hosted: dict = field(default_factory=dict)  # model id -> sha256 of the manifest of the slice it holds


def parse(host: str, out: str) -> Facts:
    f, lines = Facts(host), iter(out.splitlines())
    for line in lines:
        key, _, value = line.partition("=")
        if line == "sums<<":
            for s in lines:
                if s == ">>":
                    break
                digest, _, name = s.partition("  ")
                f.sums[name.strip()] = digest
        elif key == "memory_kib" and len(value.split()) == 2:
            total, free = value.split()
            f.memory_gb, f.free_gb = int(total) / 2**20, int(free) / 2**20
        elif key == "addresses":
            f.addresses = tuple(value.split())
        elif key == "hosted" and len(value.split()) == 2:
            f.hosted[value.split()[0]] = value.split()[1]
        elif key == "blobs":
            f.blobs = set(value.split())
        elif key in ("hostname", "system", "uv", "versions"):
            setattr(f, key, value.strip())
        elif key in ("openblas", "checkout"):
            setattr(f, key, value == "yes")
    return f


def read_facts(conf: Path, host: str, local: bool, root: Path, cache_dir: str, files: list[str]) -> Facts:
    """The facts of `host` (this machine when `local`); ssh.SshError if it cannot be reached."""
    p = ssh.run_on(conf, host, local, SCRIPT, (root, cache_dir), input="\n".join(files) + "\n", timeout=60)
    return parse(host, p.stdout)
