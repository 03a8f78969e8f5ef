#!/bin/sh
# One command for the ring: ./launch.sh [start|stop|restart|status|check|plan|logs|test|bench|prepare|setup]
# (./launch.sh help says what each does). This script only finds uv, or installs it as uv's docs say, and
# makes the environment; everything else is Python (mlx_ring/launcher/cli.py), the same on macOS and Linux.
# POSIX sh on purpose: a stock Mac runs it with bash 3.2, Debian with dash.
set -eu
cd "$(dirname "$0")"

# Started on every host by mlx.launch (rank) or the launcher (probe), the environment in place.
case "${1:-}" in rank|probe) exec .venv/bin/python -m mlx_ring.launcher.cli "$@" ;; esac

find_uv() {
  for UV in "$(command -v uv || true)" "$HOME/.local/bin/uv" "$HOME/.cargo/bin/uv" "${1:-}/bin/uv"; do
    [ -x "$UV" ] && [ ! -d "$UV" ] && return 0
  done
  return 1
}

if ! find_uv; then
  echo "installing uv, the project's environment manager (https://docs.astral.sh/uv/)..." >&2
  if [ "$(uname -s)" = Darwin ]; then
    # A Mac's /usr/bin/python3 may be a stub that asks to install Xcode's tools: uv's own installer.
    curl -LsSf https://astral.sh/uv/install.sh | sh >&2 || true
    find_uv || true
  else
    python3 -m pip install --user -q uv >&2 || python3 -m pip install -q --break-system-packages uv >&2 || true
    find_uv "$(python3 -m site --user-base 2>/dev/null || true)" ||
      { curl -LsSf https://astral.sh/uv/install.sh | sh >&2 || true; find_uv; } || true
  fi
  [ -x "$UV" ] || { echo "could not install uv; install it as https://docs.astral.sh/uv/getting-started/installation/ says (on a Mac: brew install uv), then run this again" >&2; exit 1; }
fi
export UV
# A stock Mac's /usr/bin/python3 is a stub that opens the "install developer tools" dialog when run, and uv
# runs every python3 on PATH to learn its version unless told to use only its own Pythons (as it installs).
[ "$(uname -s)" = Darwin ] && : "${UV_PYTHON_PREFERENCE:=only-managed}" && export UV_PYTHON_PREFERENCE

# The runtime environment; the launcher adds what a command needs (tests, CUDA) itself.
[ -x .venv/bin/python ] || "$UV" sync --frozen --quiet --no-dev --offline 2>/dev/null || "$UV" sync --frozen --quiet --no-dev
exec .venv/bin/python -m mlx_ring.launcher.cli "$@"
