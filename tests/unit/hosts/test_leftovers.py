"""What mlx.launch leaves behind: a rank removes its temporary files, and a stale rank of an earlier
ring is killed before a new one starts."""

import os


def test_a_rank_leaves_no_temporary_file_of_mlx_launch_behind(tmp_path, monkeypatch):
    import subprocess
    import sys

    from mlx_ring.ring.leftovers import drop_hostfile, note, own_files, sweep

    # As mlx.launch makes them: a pid file holding the rank's pid, and the ring's hostfile.
    pidfile, hostfile, other = tmp_path / "tmp.Ab12", tmp_path / "tmp.Cd34", tmp_path / "tmp.Ef56"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    pidfile.write_text(f"{dead}\n")
    hostfile.write_text('[["10.0.0.1:5000"]]')
    other.write_text("1\n")  # someone else's
    assert own_files(int(dead), str(hostfile)) == [hostfile, pidfile]
    notes = tmp_path / "tempfiles"
    notes.mkdir()
    (notes / dead).write_text(f"{pidfile}\n{hostfile}\n")  # a rank that died as it started
    mine_pid, mine_host = tmp_path / "tmp.Gh78", tmp_path / "tmp.Ij90"
    mine_pid.write_text(f"{os.getpid()}\n")
    mine_host.write_text('[["10.0.0.2:5000"]]')
    monkeypatch.setenv("MLX_HOSTFILE", str(mine_host))
    note(notes)  # a new rank: the gone one's files go, its own are noted
    assert (
        not pidfile.exists()
        and not hostfile.exists()
        and other.exists()
        and not (notes / dead).exists()
    )
    assert mine_host.exists() and mine_pid.exists()
    drop_hostfile()  # read at init
    assert not mine_host.exists()
    # while this rank lives its pid file stays: mlx.launch stops the rank with it
    assert sweep(notes) == []
    (notes / dead).write_text((notes / str(os.getpid())).read_text())  # as if it were gone
    assert sweep(notes) == [mine_pid, notes / dead] and other.exists()


def test_a_stale_rank_of_an_earlier_ring_is_killed_before_a_new_one_starts(tmp_path):
    import subprocess
    import sys

    from mlx_ring.ring.leftovers import sweep

    notes = tmp_path / "tempfiles"
    notes.mkdir()
    # a rank's command line
    stale = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "server.py"])
    # a reused pid: not ours
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for p in (stale, other):
            (tmp_path / f"tmp.{p.pid}").write_text(f"{p.pid}\n")
            (notes / str(p.pid)).write_text(f"{tmp_path / f'tmp.{p.pid}'}\n")
        assert sweep(notes) == []  # after a run: both alive, nothing removed
        removed = sweep(notes, kill=True)  # before a new ring
        assert stale.wait(5) == -9 and other.poll() is None
        assert removed == [tmp_path / f"tmp.{stale.pid}", notes / str(stale.pid)]
    finally:
        stale.kill()
        other.kill()
