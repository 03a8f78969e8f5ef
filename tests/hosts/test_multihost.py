"""The ring across hosts that share nothing: every rank in its own network namespace with its
own sshd, home and project folder (tools/testhosts.py), started over real ssh by
`./launch.sh` from this machine, which provisions each host (code, environment, its slice of
the weights) as a user's Macs."""

import json
import os
import time
from pathlib import Path

import mlx.core as mx
import openai
import pytest
from mlx_lm.generate import generate_step
from mlx_lm.utils import load_model, load_tokenizer
from ringutil import ROOT, free_port

from tools.testhosts import NetnsHosts, sh, why_not

REASON = why_not()
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

QUESTION = [{"role": "user", "content": "Name three colours of the rainbow."}]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    made = NetnsHosts(3, tmp_path_factory.mktemp("hosts"))
    try:
        yield made
    finally:
        made.close()


@pytest.fixture(scope="module")
def reference(default_model) -> tuple[str, int]:
    """Single-process mlx-lm's greedy answer and its length in tokens."""
    tokenizer = load_tokenizer(default_model)
    model, _ = load_model(default_model)
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True)
    out = []
    for tok, _ in generate_step(mx.array(prompt), model, max_tokens=MAX_TOKENS):
        if tok in tokenizer.eos_token_ids:
            break
        out.append(tok)
    return tokenizer.decode(out), len(out)


class Ring:
    """`./launch.sh` run from this machine against a hosts.json of test hosts."""

    def __init__(self, tmp: Path, hosts: NetnsHosts, **env):
        self.tmp, self.hosts, self.port = tmp, hosts, free_port()
        tmp.mkdir(parents=True, exist_ok=True)
        self.hostfile = tmp / "hosts.json"
        self.env = {
            **os.environ,
            "RING_SSH_CONFIG": str(hosts.ssh_config),
            "HOSTFILE": str(self.hostfile),
            "HOST": "0.0.0.0",
            "PORT": str(self.port),
            "RING_PORT": str(free_port(4)),
            "LOG_DIR": str(tmp / "logs"),
            "STARTUP_TIMEOUT": "120",
            **env,
        }

    def write(self, entries: list[dict]) -> None:
        self.hostfile.write_text(json.dumps(entries))
        self.rank0 = entries[0].get("ips", ["-"])[0]

    def sh(self, *args, timeout=300, **env):
        import subprocess

        t0 = time.monotonic()
        p = subprocess.run(
            [str(ROOT / "launch.sh"), *args],
            cwd=ROOT,
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        p.seconds = time.monotonic() - t0
        return p

    def answer(self) -> tuple[str, int]:
        c = openai.OpenAI(
            base_url=f"http://{self.rank0}:{self.port}/v1",
            api_key="none",
            max_retries=0,
            timeout=120,
        )
        r = c.chat.completions.create(
            model="SmolLM2-135M-Instruct", messages=QUESTION, temperature=0, max_tokens=MAX_TOKENS
        )
        return r.choices[0].message.content, r.usage.completion_tokens - (
            r.choices[0].finish_reason == "stop"
        )

    def status(self) -> dict:
        import httpx

        return httpx.get(f"http://{self.rank0}:{self.port}/cluster/status", timeout=10).json()

    def sent(self) -> dict:
        return json.loads((self.tmp / "logs" / "launch" / "sent.json").read_text())


def nothing_left(hosts: NetnsHosts) -> None:
    for h in hosts.hosts:
        assert hosts.pids(h, but_sshd=True) == [], f"processes left on {h.name}"


def test_ring_across_hosts_answers_like_mlx_lm_and_follows_hosts_json(hosts, reference, tmp_path):
    a, b, c = hosts.hosts
    for h in hosts.hosts:
        hosts.wipe(h)  # new machines: no project, no environment, no model
        hosts.start_sshd(h)
    ring = Ring(tmp_path, hosts)
    ring.write([a.entry(), b.entry()])
    r = ring.sh("start")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert f"{a.name}: code" in r.stderr and f"{b.name}: weights" in r.stderr  # progress per host
    first = ring.sent()
    for name, s in first.items():  # a new host gets exactly its slice (plus config and tokenizer)
        assert s["slice_bytes"] <= s["bytes_sent"] <= 1.05 * s["slice_bytes"], (name, s)
    assert ring.answer() == reference
    st = ring.status()
    assert [x["host"] for x in st["ranks"]] == [a.name, b.name]  # each rank on its own machine
    # Set up there as here: the ssh ranks measured themselves with OpenBLAS
    # preloaded (launch.sh rank).
    assert "|openblas" in hosts.ssh(b, "cat ~/.cache/mlx-ring/probe.json").stdout
    # A host gets the runtime: no tests, tools or docs, no dev packages, and
    # no configuration of ours.
    held = hosts.ssh(b, f"cd {ROOT} && ls -a && ls .venv/lib/python3*/site-packages").stdout.split()
    assert "server.py" in held and "mlx_lm" in held and ".python-version" in held, held
    assert not {"tests", "tools", "docs", "hosts.json", "pytest", "playwright"} & set(held), held

    # The same plan again: nothing is sent.
    r = ring.sh("restart")
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(s["bytes_sent"] == 0 for s in ring.sent().values()), ring.sent()

    # Add a host: a new rank there, a new plan, only missing pieces sent, the same answer.
    ring.write([a.entry(), b.entry(), c.entry()])
    r = ring.sh("restart")
    assert r.returncode == 0, r.stderr[-3000:]
    st3 = ring.status()
    assert [x["host"] for x in st3["ranks"]] == [a.name, b.name, c.name]
    assert st3["plan"]["ranges"] != st["plan"]["ranges"]
    sent = ring.sent()
    assert (
        sent[c.name]["slice_bytes"]
        <= sent[c.name]["bytes_sent"]
        <= 1.05 * sent[c.name]["slice_bytes"]
    )
    # its slice shrank: it had it all
    assert sent[a.name]["bytes_sent"] < 0.5 * sent[a.name]["slice_bytes"]
    assert ring.answer() == reference

    # Remove one: two ranks again. Rank 0's control link at the address hosts.json gives (as on a
    # Thunderbolt ring of 3 Macs, where rank 0's ring addresses are its neighbours' alone).
    control = f"{hosts.net}.111"
    sh(f"ip -n {a.netns} addr add {control}/24 dev eth0")
    ring.write([a.entry(control=control), c.entry()])
    r = ring.sh("restart")
    assert r.returncode == 0, r.stderr[-3000:]
    assert [x["host"] for x in ring.status()["ranks"]] == [a.name, c.name]
    assert ring.answer() == reference
    logs = "".join(p.read_text(errors="replace") for p in (tmp_path / "logs").rglob("*.log"))
    assert f"control link to rank 0 ({a.name}) at {control}," in logs, logs[-3000:]
    r = ring.sh("stop")
    assert r.returncode == 0
    nothing_left(hosts)

    # The preflight: a row per host, the link between them measured, the plan's prediction; exit 0.
    r = ring.sh("check")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    rows = [x.split() for x in r.stdout.splitlines() if x.split() and x.split()[0] in ("0", "1")][
        :2
    ]
    assert [x[1] for x in rows] == [a.name, c.name] and all("0.32" in " ".join(x) for x in rows), (
        r.stdout
    )
    assert f"link 0 -> 1 ({a.name} -> {c.address}:" in r.stdout and "Gbit/s" in r.stdout
    # the measured hops enter a pipeline's prediction; a tensor plan's counts its all_sums instead
    assert (
        "network hops" in r.stdout or "mode tensor" in r.stdout
    ) and "all hosts ready" in r.stderr
    nothing_left(hosts)

    # On a slow link the same check is as quick: the bandwidth probe is bounded in time, not bytes
    # (64 MB at 10 Mbit/s would take 54 s), and the link is called slow.
    hosts.shape("10mbit")
    try:
        r = ring.sh("check")
    finally:
        hosts.shape(None)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr[-3000:]
    assert r.seconds < 30 and "Gbit/s (slow: below 100 Mbit/s" in r.stdout, (r.seconds, r.stdout)
    nothing_left(hosts)


def failure(hosts: NetnsHosts, tmp: Path, entries: list[dict], **env) -> str:
    """Start a ring that must not start: within 20 s, a sentence per
    problem, nothing left running."""
    ring = Ring(tmp, hosts, **env)
    ring.write(entries)
    r = ring.sh("start")
    assert r.returncode != 0, r.stderr
    assert r.seconds < 20, f"took {r.seconds:.1f} s: {r.stderr[-2000:]}"
    lines = [x for x in r.stderr.splitlines() if x.startswith("cannot start: ")]
    assert lines, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    nothing_left(hosts)
    return "\n".join(lines)


def test_failures_a_user_hits_are_one_sentence_naming_the_host(hosts, tmp_path):
    a, b, c = hosts.hosts
    hosts.stop_sshd(c)
    said = failure(hosts, tmp_path / "down", [a.entry(), c.entry()])
    assert (
        f"cannot reach {c.name} over ssh" in said
        and "Connection refused" in said
        and "Remote Login" in said
    )
    hosts.start_sshd(c)

    said = failure(
        hosts, tmp_path / "off", [a.entry(), {"ssh": "ringhost-off", "ips": [f"{hosts.net}.99"]}]
    )
    assert (
        "cannot reach ringhost-off over ssh" in said
        and "is it on, awake and on this network" in said
    )

    said = failure(hosts, tmp_path / "address", [a.entry(), {"ssh": b.name, "ips": [c.address]}])
    assert f"{b.name} (rank 1) does not own ring address {c.address}" in said and b.address in said

    said = failure(hosts, tmp_path / "memory", [a.entry(), c.entry(max_memory_gb=0.05)])
    assert f"{c.name} (rank 1) holds at most 0 " in said and "the model does not fit" in said

    said = failure(hosts, tmp_path / "malformed", [{"ssh": a.name}])
    assert 'entry 0 (ringhost-a) lacks "ips"' in said


def test_hosts_that_differ_are_refused_when_provisioning_is_off(hosts, tmp_path):
    a, b, c = hosts.hosts
    # run alone: provision c, as the first test leaves it
    if hosts.ssh(c, f"test -f {ROOT}/server.py", check=False).returncode:
        ring = Ring(tmp_path / "ok", hosts)
        ring.write([a.entry(), c.entry()])
        assert ring.sh("start").returncode == 0 and ring.sh("stop").returncode == 0
    # c as a new machine (its project folder empty, as wipe() leaves it), then as it was:
    # a ring start that provisions a new host is the first test's; here only what is
    # refused without provisioning.
    project, hidden = c.folder / "project", c.folder / "hidden"
    hidden.mkdir()
    for p in list(project.iterdir()):
        p.rename(hidden / p.name)
    try:
        said = failure(hosts, tmp_path / "empty", [a.entry(), c.entry()], PROVISION="0")
    finally:
        for p in list(hidden.iterdir()):
            p.rename(project / p.name)
        hidden.rmdir()
    assert f"{c.name} has no copy of the project at {ROOT}" in said

    # Change one file on c and fake another mlx version there.
    hosts.ssh(c, f"echo '# edited' >> {ROOT}/shard.py")
    said = failure(hosts, tmp_path / "code", [a.entry(), c.entry()], PROVISION="0")
    assert f"{c.name}'s copy of the project differs from this one in 1 file(s) (shard.py)" in said
    site = f"{ROOT}/.venv/lib/python3*/site-packages"
    fake = (
        f"sed -i 's/^Version: .*/Version: {{0}}/' {site}/mlx-{{1}}.dist-info/METADATA && "
        f"mv {site}/mlx-{{1}}.dist-info $(dirname {site}/mlx-{{1}}.dist-info)/mlx-{{0}}.dist-info"
    )
    version = (
        hosts.ssh(c, f"ls -d {site}/mlx-[0-9]*.dist-info")
        .stdout.strip()
        .rsplit("mlx-", 1)[1]
        .split(".dist")[0]
    )
    hosts.ssh(c, fake.format("0.0.1", version))  # as if an older mlx were installed there
    said = failure(hosts, tmp_path / "versions", [a.entry(), c.entry()], PROVISION="0")
    assert f"{c.name} runs mlx, mlx-lm 0.0.1" in said
    hosts.ssh(c, fake.format(version, "0.0.1"))
    hosts.ssh(c, f"mv {ROOT}/.venv {ROOT}/.venv-away")
    said = failure(hosts, tmp_path / "no-env", [a.entry(), c.entry()], PROVISION="0")
    assert f"{c.name} has the project but no environment in {ROOT}/.venv" in said
    hosts.ssh(c, f"mv {ROOT}/.venv-away {ROOT}/.venv")

    # Provisioning mends the edit.
    ring = Ring(tmp_path / "mended", hosts)
    ring.write([a.entry(), c.entry()])
    r = ring.sh("start")
    assert r.returncode == 0, r.stderr[-3000:]
    line = next((x for x in r.stderr.splitlines() if x.startswith(f"{c.name}: code ")), "")
    assert "(replaced there: " in line and "shard.py" in line.partition("(replaced there: ")[2], (
        r.stderr[-3000:]
    )
    assert ring.sh("stop").returncode == 0
    assert "# edited" not in hosts.ssh(c, f"tail -n 1 {ROOT}/shard.py").stdout


def test_a_rank_that_dies_by_a_signal_is_told_apart_from_a_host_gone(hosts, tmp_path):
    import subprocess

    from mlx_ring.hosts import ssh
    from mlx_ring.launcher.attempt import why_left
    from mlx_ring.launcher.waiting import reachable

    a = hosts.hosts[0]
    conf = ssh.write_config(tmp_path / "ssh_config", str(hosts.ssh_config))
    # ssh's exit code when the command it ran died by a signal: the code mlx.launch
    # reports for the rank.
    died = subprocess.run(ssh.argv(conf, a.name, "kill -9 $$"), capture_output=True, timeout=60)
    assert died.returncode == 255, died.stderr

    def answers(host):
        return reachable(conf, host)

    said = why_left(1, a.name, 255, answers)
    assert (
        said.startswith(f"rank 1 on {a.name} died") and f"see logs/rank1.log on {a.name}" in said
    ), said
    said = why_left(1, "ringhost-off", 255, answers)  # ssh's own failure: the host answers nothing
    assert "stopped answering" in said and "off, asleep or off the network" in said, said


def test_check_before_the_first_start_says_what_start_will_set_up(hosts, tmp_path):
    a, b, c = hosts.hosts
    hosts.wipe(c)  # a new machine (last in this file: later tests would have to provision it again)
    hosts.start_sshd(c)
    ring = Ring(tmp_path, hosts)
    ring.write([a.entry(), c.entry()])
    r = ring.sh("check")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert "not set up yet (`./launch.sh start` does this first" in r.stdout, r.stdout
    assert (
        f"{c.name}: `./launch.sh start` will copy the project to {ROOT}, install uv, "
        "install its environment" in r.stdout
    )
    assert "problem" not in r.stdout
    assert "host(s) not set up yet, which `./launch.sh start` sets up" in r.stderr, r.stderr[-2000:]
    # Still checked before anything is set up: ssh, and each ring address.
    ring.write([a.entry(), {"ssh": c.name, "ips": [b.address]}])
    r = ring.sh("check")
    assert (
        r.returncode == 2 and f"{c.name} (rank 1) does not own ring address {b.address}" in r.stderr
    ), r.stderr[-2000:]
    ring.write([a.entry(), {"ssh": "ringhost-off", "ips": [f"{hosts.net}.99"]}])
    r = ring.sh("check")
    assert r.returncode == 2 and "cannot reach ringhost-off over ssh" in r.stderr, r.stderr[-2000:]
    nothing_left(hosts)
