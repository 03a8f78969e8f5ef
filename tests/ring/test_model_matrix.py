"""Every text-decoder type mlx-lm ships, as a tiny random model (tests/model_zoo.py), split unevenly
on 2 and on 3 ranks, sequences joining and leaving a batch, prefill in chunks and cached decode,
against single-process mlx-lm: logits within 1e-4, tokens equal; the mixture-of-experts types 4-bit
too. A type is admitted exactly when all its runs pass; mlx_ring/models/supported.json records what
this test finds and the test fails where the file says otherwise. After a change (mlx-lm, slicing,
the server's ring), write the file and docs/models.md's table anew with

    MLX_RING_ADMIT=1 ./launch.sh test tests/ring/test_model_matrix.py

Startup is most of a ring run, so each rank count runs every type in one launch; a type whose run
raises ends that launch, and the next launch goes on from the type after it. So that this is rare,
every type first runs alone in one process (the same scheduler, the whole model on one rank, going
on past a failure) and as the same cuts chained in one process (`Slice`s, as each rank holds them);
a type that fails there is refused with that reason and does not go to the ring; a type refused on 2
ranks does not run on 3 (a type that stalls costs a launch its watchdog's wait). No model runs in
this test's own process: a model may corrupt the memory of the process it runs in.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from model_zoo import make, text_decoder_types
from ringutil import ROOT, launch_cmd

from mlx_ring.models import support

DRIVER = str(ROOT / "tests" / "matrix_driver.py")
# Three sequences: two at once (one longer than the tiny sliding windows), a third joining later.
SPEC = [
    {"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 4, "at": 0},
    {"prompt": [8, 1], "max_tokens": 5, "at": 0},
    {"prompt": [30, 2, 9, 9, 41], "max_tokens": 3, "at": 2},
]
# ranks -> layers per rank (of zoo_fields.LAYERS), decode groups, prefill chunk: 16 lets waiting
# prompts share a padded batch, 4 cuts the longest prompt in two.
RUNS = {2: ("3,1", 2, 16), 3: ("1,2,1", 1, 4)}
QUANTIZED_RANKS = 3  # the 4-bit mixture-of-experts runs
STALL_S = 40  # a launch that finishes no model for this long is stuck in the model it started


def test_every_mlx_lm_text_decoder_type_is_admitted_exactly_when_its_runs_pass(tmp_path):
    found = run_matrix(tmp_path)
    if os.environ.get("MLX_RING_ADMIT") == "1":
        support.write(found)
    recorded = support.load()
    admitted = sorted(k for k, v in found.items() if v["admitted"])
    failing = {k: found[k]["reason"] for k in sorted(set(recorded["admitted"]) - set(admitted))}
    assert admitted == sorted(recorded["admitted"]), (
        "admitted now but not in supported.json: "
        f"{sorted(set(admitted) - set(recorded['admitted']))}; in supported.json but failing now: "
        f"{failing}; see this file's docstring to record what the matrix finds"
    )
    assert sorted(recorded["refused"]) == sorted(k for k, v in found.items() if not v["admitted"])
    assert (ROOT / "docs" / "models.md").read_text().count(support.table()) == 1


def run_matrix(tmp: Path) -> dict:
    """{type: {"admitted": bool, "reason": why not, "caches": cache kinds}} for every type."""
    found, cases = {}, []
    for kind in text_decoder_types():
        try:
            folder = make(kind, tmp / "models" / kind)
        except Exception as e:  # noqa: BLE001 -- any failure to build is the reason this type is refused
            found[kind] = {"admitted": False, "reason": f"no tiny model: {_line(e)}", "caches": []}
            continue
        model = load_model(folder, lazy=True)[0]
        found[kind] = {
            "admitted": True,
            "reason": "",
            "caches": sorted({type(c).__name__ for c in make_prompt_cache(model)}),
        }
        cases += [(kind, n, 0, folder) for n in RUNS]
        if any("expert" in k or "switch" in k for k, _ in tree_flatten(model.parameters())):
            cases.append(
                (kind, QUANTIZED_RANKS, 4, make(kind, tmp / "models" / f"{kind}-4bit", bits=4))
            )
    alone = {(kind, bits): tmp / "alone" / f"{kind}-{bits}" for kind, _, bits, _ in cases}
    for case, reason in screen(tmp / "alone", cases).items():
        kind = case[0]
        if reason and found[kind]["admitted"]:
            found[kind] = dict(found[kind], admitted=False, reason=reason)
    # fewer ranks first: a type refused there runs no more (its reason is that run's)
    for n in RUNS:
        ran = run_launches(
            tmp / f"ranks{n}", n, [c for c in cases if c[1] == n and found[c[0]]["admitted"]], alone
        )
        for (kind, _, bits, _), reason in ran.items():
            if reason and found[kind]["admitted"]:
                found[kind] = dict(
                    found[kind],
                    admitted=False,
                    reason=f"{n} ranks{f', {bits}-bit' if bits else ''}: {reason}",
                )
    return found


def screen(tmp: Path, cases: list) -> dict:
    """{case: None, or why it failed} for each distinct model: alone in one process, then cut as
    on the ring."""
    tmp.mkdir(parents=True)
    models = list(dict.fromkeys((kind, bits, folder) for kind, _, bits, folder in cases))
    outs = [tmp / f"{kind}-{bits}" for kind, bits, _ in models]
    for o in outs:
        o.mkdir()
    layers, groups, chunk = RUNS[2]
    left, stderr = list(zip(models, outs)), {}
    while left:  # a model that crashes the process (not an exception) ends it: go on after it
        argv = [
            DRIVER,
            "--keep-going",
            "--cuts",
            RUNS[2][0],
            RUNS[3][0],
            "--model",
            *(str(m[2]) for m, _ in left),
            "--out",
            *(str(o) for _, o in left),
            "--layers",
            *["-"] * len(left),
            "--spec",
            json.dumps(SPEC),
            "--groups",
            str(groups),
            "--chunk",
            str(chunk),
        ]
        proc = subprocess.run(
            [sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=1200
        )
        died = [
            (m, o)
            for m, o in left
            if (o / "started0").exists()
            and not (o / "done0").exists()
            and not (o / "error0.txt").exists()
        ]
        # a model that corrupted the process's memory may take the next one down: alone again
        for m, o in died:
            stderr[o] = proc.stderr[-300:]
            if len(left) > 1 and m != left[0][0]:
                (o / "started0").unlink()
                left = [(m, o)] + [
                    x for x in left if x[0] != m and not (x[1] / "started0").exists()
                ]
                break
        else:
            left = [(m, o) for m, o in left if not (o / "started0").exists()]
    out = {}
    for (kind, bits, folder), o in zip(models, outs):
        quant = f", {bits}-bit" if bits else ""
        if (o / "error0.txt").exists():
            reason = f"alone{quant}: {_line((o / 'error0.txt').read_text())}"
        elif not (o / "done0").exists():
            reason = f"alone{quant}: the process died in it: {stderr[o]!r}"
        else:
            reason = judge(o, o, 1)
            reason = f"alone{quant}: {reason}" if reason else None
        if reason is None:
            cut = json.loads((o / "cuts.json").read_text())
            reason = next((f"cut {sizes}{quant}: {r}" for sizes, r in cut.items() if r), None)
        out.update({c: reason for c in cases if (c[0], c[2]) == (kind, bits)})
    return out


def run_launches(tmp: Path, n: int, cases: list, alone: dict) -> dict:
    """{case: None, or why it failed} for cases on n ranks, as few launches
    as the failures allow."""
    tmp.mkdir(parents=True)
    left, out = list(cases), {}
    while left:
        outs = [tmp / f"{kind}-{bits}" for kind, _, bits, _ in left]
        for o in outs:
            o.mkdir(exist_ok=True)
        layers, groups, chunk = RUNS[n]
        argv = [
            DRIVER,
            "--model",
            *(str(c[3]) for c in left),
            "--out",
            *map(str, outs),
            "--layers",
            *[layers] * len(left),
            "--spec",
            json.dumps(SPEC),
            "--groups",
            str(groups),
            "--chunk",
            str(chunk),
            "--stall",
            str(STALL_S / 2),
        ]
        proc = subprocess.Popen(
            launch_cmd(n, tmp, argv),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        log = _wait(proc, outs, n)
        for case, o in list(zip(left, outs)):
            if all((o / f"done{r}").exists() for r in range(n)):
                out[case] = judge(o, alone[case[0], case[2]], n)
            elif any((o / f"started{r}").exists() for r in range(n)):
                errors = [
                    (o / f"error{r}.txt").read_text()
                    for r in range(n)
                    if (o / f"error{r}.txt").exists()
                ]
                out[case] = (
                    _line(errors[0])
                    if errors
                    else _stalled(o, n) or f"the ring stopped in it: {log[-300:]!r}"
                )
            else:
                continue
            left.remove(case)
        if left and not any((o / f"started{r}").exists() for o in outs for r in range(n)):
            raise AssertionError(f"a launch on {n} ranks ran no model:\n{log[-4000:]}")
    return out


def _wait(proc, outs: list, n: int) -> str:
    """The launch's output once it ends, or once it finishes no model for STALL_S
    (then it is killed)."""
    done, last = 0, time.monotonic()
    while proc.poll() is None:
        now_done = sum((o / f"done{r}").exists() for o in outs for r in range(n))
        errored = any((o / f"error{r}.txt").exists() for o in outs for r in range(n))
        if now_done != done:
            done, last = now_done, time.monotonic()
        # the other ranks would wait for the failed one forever
        if errored or time.monotonic() - last > STALL_S:
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return proc.communicate()[0]


def judge(out: Path, alone: Path, n: int) -> str | None:
    """Why this run differs from single-process mlx-lm (its logits, written by the
    alone run), or None."""
    result = json.loads((out / "result.json").read_text())
    want_all = json.loads((alone / "want.json").read_text())
    for i, s in enumerate(SPEC):
        want, want_tokens = np.load(alone / f"want{i}.npy"), want_all[i]
        got = np.load(out / f"logits{i}.npy")
        if not np.isfinite(want).all():
            return "mlx-lm's own logits are not finite for the tiny model"
        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-4, atol=1e-4):
            diff = float(np.abs(got - want).max()) if got.shape == want.shape else got.shape
            return f"sequence {i}: logits differ from single-process mlx-lm by {diff}"
        if result["tokens"][i] != want_tokens:
            return f"sequence {i}: tokens {result['tokens'][i]} != mlx-lm's {want_tokens}"
    if not all(r["open_sequences"] == 0 and r["cached_tokens"] == 0 for r in result["status"]):
        return "caches not freed after every sequence left"
    return None


def _stalled(out: Path, n: int) -> str:
    """Where each rank waited when the driver's watchdog ended a model that took too long."""
    where = []
    for r in range(n):
        stack = (out / f"stack{r}.txt").read_text() if (out / f"stack{r}.txt").exists() else ""
        frames = [
            f"{ln.split(chr(34))[1].rsplit('/', 1)[-1]}:{ln.rsplit(' in ', 1)[-1]}"
            for ln in stack.splitlines()
            if ln.strip().startswith("File ")
        ][:2]
        where += [f"rank {r} in {' < '.join(frames)}"] if frames else []
    return f"stalled: {'; '.join(where)}" if where else ""


def _line(e) -> str:
    return str(e).strip().splitlines()[0][:240] if str(e).strip() else type(e).__name__
