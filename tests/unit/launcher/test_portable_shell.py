"""The launcher's shell as every shell it meets runs it: dash and posh (strict POSIX), and a real
bash 3.2 as `bash` and as `sh` (what a stock Mac runs: /bin/sh there is bash 3.2 in POSIX mode).
Also the uv install step as a stock Mac takes it, with a PATH of only what a fresh macOS has."""

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from stockmac import BASH_32, stock_path, stubs_called

from mlx_ring.hosts.provision import RECEIVE_CODE

ROOT = Path(__file__).resolve().parents[3]


def posix_shell(name: str) -> str:
    """Debian's `name` (dash, posh), installed when missing where we may (root, as CI is)."""
    if not shutil.which(name) and os.geteuid() == 0 and shutil.which("apt-get"):
        quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
        if subprocess.run(["apt-get", "install", "-y", "-qq", name], **quiet).returncode:
            subprocess.run(["apt-get", "update", "-qq"], **quiet)
            subprocess.run(["apt-get", "install", "-y", "-qq", name], **quiet)
    if not shutil.which(name):
        pytest.skip(
            f"{name} is not installed (apt-get install {name}) and this user cannot install it"
        )
    return shutil.which(name)


@pytest.fixture(params=["dash", "posh", "bash-3.2", "bash-3.2 as sh"])
def shell(request, tmp_path) -> str:
    if request.param.startswith("bash-3.2"):
        if not BASH_32.exists():
            pytest.skip(f"no bash 3.2 at {BASH_32} (the project's shared/mac folder)")
        # bash started as `sh` runs in POSIX mode, as macOS's /bin/sh
        if request.param.endswith("as sh"):
            (tmp_path / "sh").symlink_to(BASH_32)
            return str(tmp_path / "sh")
        return str(BASH_32)
    return posix_shell(request.param)


def test_launch_sh_runs_under_every_shell(shell):
    assert subprocess.run([shell, "-n", "launch.sh"], cwd=ROOT).returncode == 0
    p = subprocess.run(
        [shell, "launch.sh", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert p.returncode == 0 and p.stdout.startswith("usage: ./launch.sh"), p.stdout + p.stderr
    p = subprocess.run(
        [shell, "launch.sh", "no-such-command"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and "unknown command 'no-such-command'" in p.stderr, p.stderr


def test_ring_ssh_wrapper_under_every_shell(shell, tmp_path):
    """mlx.launch's `ssh`: the ring's config first, every "\\r" dropped from
    the arguments, no stdin."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text("#!/bin/sh\nfor a; do printf '[%s]' \"$a\"; done; cat; echo\n")
    (fake / "ssh").chmod(0o755)
    wrapper = ROOT / "mlx_ring/hosts/bin/ssh"
    env = {
        **os.environ,
        "PATH": f"{wrapper.parent}:{fake}:{os.environ['PATH']}",
        "RING_SSH_FILE": "/ring/ssh_config",
    }
    p = subprocess.run(
        [shell, str(wrapper), "-tt", "mini 2", "kill $(cat /tmp/tmp.x1\r)", "a b"],
        env=env,
        input="never read",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert p.stdout == "[-F][/ring/ssh_config][-tt][mini 2][kill $(cat /tmp/tmp.x1)][a b]\n", (
        p.stdout + p.stderr
    )


def test_receiving_code_under_every_shell(shell, tmp_path):
    """The script a host runs to take the project's files, and its refusal where it cannot write."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo("mlx_ring/x.py")
        info.size = 3
        tar.addfile(info, io.BytesIO(b"x=1"))
    dest = tmp_path / "Users" / "Shared" / "mlx-ring"
    p = subprocess.run(
        [shell, "-c", RECEIVE_CODE, "sh", str(dest)], input=buf.getvalue(), capture_output=True
    )
    assert p.returncode == 0 and (dest / "mlx_ring/x.py").read_text() == "x=1", p.stderr
    p = subprocess.run(
        [shell, "-c", RECEIVE_CODE, "sh", "/dev/null/mlx-ring"],
        input=buf.getvalue(),
        capture_output=True,
    )
    assert p.returncode == 4 and b"cannot write /dev/null/mlx-ring" in p.stderr, p.stderr


def test_uv_installed_as_on_a_stock_mac(tmp_path):
    """No uv, a Mac's PATH and bash 3.2 as /bin/sh: uv's own installer is fetched with curl
    (python3 may be a stub that opens a dialog), uv lands in ~/.local/bin, and the launcher goes
    on to Python."""
    if not BASH_32.exists():
        pytest.skip(f"no bash 3.2 at {BASH_32}")
    home, stock = tmp_path / "home", tmp_path / "stock"
    home.mkdir()
    uv = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    installer = f'mkdir -p "$HOME/.local/bin" && ln -s {uv} "$HOME/.local/bin/uv"'
    path = stock_path(
        stock,
        extra={
            "uname": "#!/bin/sh\n[ \"${1:-}\" = -s ] && echo Darwin || echo 'Darwin arm64'\n",
            # astral.sh is out of reach here: this curl hands over an installer that puts
            # uv where uv's does.
            "curl": f"#!/bin/sh\necho '{installer}' \n",
        },
    )
    p = subprocess.run(
        [f"{stock}/sh", "launch.sh", "help"],
        cwd=ROOT,
        env={"PATH": path, "HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0 and "installing uv" in p.stderr and p.stdout.startswith("usage:"), (
        p.stdout + p.stderr
    )
    assert (home / ".local/bin/uv").exists() and stubs_called(stock) == []


def test_uv_installed_with_pip_where_its_user_base_says(tmp_path):
    """Elsewhere uv comes from pip --user, found in the bin folder of `python3 -m site --user-base`
    (~/Library/Python/3.x/bin on a Mac's Python, which ~/.local/bin is not)."""
    real = Path(
        subprocess.run(
            ["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True
        ).stdout.strip()
    )
    if (
        not real.exists()
        or subprocess.run([str(real), "-m", "pip", "--version"], capture_output=True).returncode
    ):
        pytest.skip("no python3 with pip on PATH")
    home, stock = tmp_path / "home", tmp_path / "stock"
    home.mkdir()
    base = home / "Library/Python/3.11"
    path = stock_path(
        stock, shell=Path(posix_shell("dash")), extra={"python3": f'#!/bin/sh\nexec {real} "$@"\n'}
    )
    p = subprocess.run(
        [f"{stock}/sh", "launch.sh", "help"],
        cwd=ROOT,
        timeout=300,
        capture_output=True,
        text=True,
        env={"PATH": path, "HOME": str(home), "PYTHONUSERBASE": str(base), "PIP_NO_INPUT": "1"},
    )
    assert p.returncode == 0 and "installing uv" in p.stderr and p.stdout.startswith("usage:"), (
        p.stdout + p.stderr
    )
    assert (base / "bin/uv").exists() and not (home / ".local/bin/uv").exists()


def test_uv_uses_only_its_own_pythons_on_a_mac(tmp_path):
    """On a Mac, launch.sh tells uv to use only the Pythons uv installs: otherwise uv runs every
    python3 on PATH to learn its version, and a stock Mac's /usr/bin/python3 is a stub that opens
    the "install developer tools" dialog. Elsewhere uv keeps its default (an environment on the
    system's Python stays)."""
    if not BASH_32.exists():
        pytest.skip(f"no bash 3.2 at {BASH_32}")
    uv = shutil.which("uv") or str(Path.home() / ".local/bin/uv")
    if not Path(uv).exists():
        pytest.skip("no uv on this machine")
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "launch.sh", project)
    # launch.sh's first `uv sync`, on a checkout without an environment: which
    # preference does uv get?
    fake_uv = (
        f'#!/bin/sh\necho "${{UV_PYTHON_PREFERENCE:-default}}" > '
        f"'{tmp_path}/asked'\nmkdir -p .venv/bin\n"
        "printf '#!/bin/sh\\nexit 0\\n' > .venv/bin/python\nchmod +x .venv/bin/python\n"
    )
    for system, asked in (("Darwin", "only-managed"), ("Linux", "default")):
        shutil.rmtree(project / ".venv", ignore_errors=True)
        stock = tmp_path / f"stock-{system}"
        path = stock_path(stock, extra={"uname": f"#!/bin/sh\necho {system}\n", "uv": fake_uv})
        p = subprocess.run(
            [f"{stock}/sh", "launch.sh", "help"],
            cwd=project,
            env={"PATH": path, "HOME": str(tmp_path)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert p.returncode == 0 and (tmp_path / "asked").read_text().strip() == asked, p.stderr
    # What the setting does, with the real uv: a stub python3 first on PATH (as a stock
    # Mac's), no Python of uv's own and no downloads. By default uv runs the stub; with
    # only-managed it never does.
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "0"\nrequires-python = ">=3.11"\n'
    )
    for preference, runs_stub in ((None, True), ("only-managed", False)):
        stock = tmp_path / f"stubs-{preference}"
        stock_path(stock)
        env = {
            "PATH": f"{stock}:{os.environ['PATH']}",
            "HOME": str(tmp_path),
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_PYTHON_INSTALL_DIR": str(tmp_path / "no-pythons"),
            "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
            **({"UV_PYTHON_PREFERENCE": preference} if preference else {}),
        }
        subprocess.run(
            [uv, "sync", "--no-progress"],
            cwd=tmp_path / "app",
            env=env,
            capture_output=True,
            timeout=120,
        )
        assert ("python3" in stubs_called(stock)) is runs_stub, preference
