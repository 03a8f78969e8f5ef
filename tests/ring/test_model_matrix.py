"""Every text-decoder type mlx-lm ships, as a tiny random model (tools/model_zoo.py), split unevenly on
2 and on 3 ranks, sequences joining and leaving a batch, prefill in chunks and cached decode, against
single-process mlx-lm: logits within 1e-4, tokens equal; the mixture-of-experts types 4-bit too. A type
is admitted exactly when all its runs pass; mlx_ring/models/supported.json records what this test finds
and the test fails where the file says otherwise. After a change (mlx-lm, slicing, the server's ring),
write the file and docs/models.md's table anew with

    MLX_RING_ADMIT=1 ./launch.sh test tests/ring/test_model_matrix.py

Startup is most of a ring run, so each rank count runs every type in one launch; a type whose run
raises ends that launch, and the next launch goes on from the type after it. So that this is rare,
every type first runs alone in one process (the same scheduler, the whole model on one rank, going on
past a failure) and as the same cuts chained in this process (`Slice`s, as each rank holds them); a
type that fails there is refused with that reason and does not go to the ring.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.utils import load_model
from model_zoo import make, text_decoder_types
from ringutil import ROOT, launch_cmd, reference_logits

from mlx_ring.models import support
from mlx_ring.models.slicing import Slice

DRIVER = str(ROOT / "tests" / "matrix_driver.py")
# Three sequences: two at once (one longer than the tiny sliding windows), a third joining later.
SPEC = [{"prompt": [5, 17, 42, 99, 3, 250, 7], "max_tokens": 4, "at": 0},
        {"prompt": [8, 1], "max_tokens": 5, "at": 0},
        {"prompt": [30, 2, 9, 9, 41], "max_tokens": 3, "at": 2}]
# ranks -> layers per rank (of model_zoo.LAYERS), decode groups, prefill chunk: 16 lets waiting prompts
# share a padded batch, 4 cuts the longest prompt in two.
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
        f"admitted now but not in supported.json: {sorted(set(admitted) - set(recorded['admitted']))}; "
        f"in supported.json but failing now: {failing}; see this file's docstring to record what the matrix finds")
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
        found[kind] = {"admitted": True, "reason": "", "caches": sorted({type(c).__name__ for c in make_prompt_cache(model)})}
        cases += [(kind, n, 0, folder) for n in RUNS]
        if any("expert" in k or "switch" in k for k, _ in tree_flatten(model.parameters())):
            cases.append((kind, QUANTIZED_RANKS, 4, make(kind, tmp / "models" / f"{kind}-4bit", bits=4)))
    for case, reason in screen(tmp / "alone", cases).items():
        kind = case[0]
        if reason and found[kind]["admitted"]:
            found[kind] = dict(found[kind], admitted=False, reason=reason)
    cases = [c for c in cases if found[c[0]]["admitted"]]
    for n in RUNS:
        ran = run_launches(tmp / f"ranks{n}", n, [c for c in cases if c[1] == n])
        for (kind, _, bits, _), reason in ran.items():
            if reason and found[kind]["admitted"]:
                found[kind] = dict(found[kind], admitted=False, reason=f"{n} ranks{f', {bits}-bit' if bits else ''}: {reason}")
    return found


def screen(tmp: Path, cases: list) -> dict:
    """{case: None, or why it failed} for each distinct model: alone in one process, then cut as on the ring."""
    tmp.mkdir(parents=True)
    models = list(dict.fromkeys((kind, bits, folder) for kind, _, bits, folder in cases))
    outs = [tmp / f"{kind}-{bits}" for kind, bits, _ in models]
    for o in outs:
        o.mkdir()
    layers, groups, chunk = RUNS[2]
    left, stderr = list(zip(models, outs)), {}
    while left:  # a model that crashes the process (not an exception) ends it: go on after it
        argv = [DRIVER, "--keep-going", "--model", *(str(m[2]) for m, _ in left), "--out", *(str(o) for _, o in left),
                "--layers", *["-"] * len(left), "--spec", json.dumps(SPEC), "--groups", str(groups), "--chunk", str(chunk)]
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, capture_output=True, text=True, timeout=1200)
        for o in [o for _, o in left if (o / "started0").exists()]:
            stderr[o] = proc.stderr[-300:]
        left = [(m, o) for m, o in left if not (o / "started0").exists()]
    out = {}
    for (kind, bits, folder), o in zip(models, outs):
        quant = f", {bits}-bit" if bits else ""
        if (o / "error0.txt").exists():
            reason = f"alone{quant}: {_line((o / 'error0.txt').read_text())}"
        elif not (o / "done0").exists():
            reason = f"alone{quant}: the process died in it: {stderr[o]!r}"
        else:
            reason = judge(o, folder, 1)
            reason = f"alone{quant}: {reason}" if reason else None
        if reason is None:
            reason = next((f"cut {sizes}{quant}: {r}" for sizes in (RUNS[2][0], RUNS[3][0])
                           if (r := chained_cuts(folder, [int(x) for x in sizes.split(",")]))), None)
        out.update({c: reason for c in cases if (c[0], c[2]) == (kind, bits)})
    return out


def chained_cuts(folder: Path, sizes: list[int]) -> str | None:
    """Why the model's cuts, chained in this process (embed, each rank's layers, head), differ from
    the whole model for one prompt and its cached decode steps, or None."""
    try:
        bounds = np.cumsum([0] + sizes).tolist()
        ring = []
        for r in range(len(sizes)):
            model = load_model(folder, lazy=True)[0]
            ring.append(Slice(model, bounds[r], bounds[r + 1], ends=r == 0))
            mx.eval(model.parameters())
        caches = [c.new_caches() for c in ring]

        def step(tokens):
            h = ring[0].embed(mx.array([tokens]))
            for c, kv in zip(ring, caches):
                h = c.forward(h, kv)
            return ring[0].head(h)[0, -1]

        prompt = SPEC[0]["prompt"]
        want, _ = reference_logits(folder, prompt, steps=3)
        logits, got = step(prompt), []
        for _ in range(3):
            got.append(np.array(logits.astype(mx.float32)))
            logits = step([int(mx.argmax(logits).item())])
    except Exception as e:  # noqa: BLE001 -- the reason this type is refused
        return f"{type(e).__name__}: {_line(e)}"
    err = float(np.abs(np.stack(got) - want).max())
    return f"logits differ from the whole model's by {err}" if not err <= 1e-4 else None


def run_launches(tmp: Path, n: int, cases: list) -> dict:
    """{case: None, or why it failed} for cases on n ranks, as few launches as the failures allow."""
    tmp.mkdir(parents=True)
    left, out = list(cases), {}
    while left:
        outs = [tmp / f"{kind}-{bits}" for kind, _, bits, _ in left]
        for o in outs:
            o.mkdir(exist_ok=True)
        layers, groups, chunk = RUNS[n]
        argv = [DRIVER, "--model", *(str(c[3]) for c in left), "--out", *map(str, outs), "--layers", *[layers] * len(left),
                "--spec", json.dumps(SPEC), "--groups", str(groups), "--chunk", str(chunk)]
        proc = subprocess.Popen(launch_cmd(n, tmp, argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        log = _wait(proc, outs, n)
        for case, o in list(zip(left, outs)):
            if all((o / f"done{r}").exists() for r in range(n)):
                out[case] = judge(o, case[3], n)
            elif any((o / f"started{r}").exists() for r in range(n)):
                errors = [(o / f"error{r}.txt").read_text() for r in range(n) if (o / f"error{r}.txt").exists()]
                out[case] = _line(errors[0]) if errors else f"the ring stopped in it: {log[-300:]!r}"
            else:
                continue
            left.remove(case)
        if left and not any((o / f"started{r}").exists() for o in outs for r in range(n)):
            raise AssertionError(f"a launch on {n} ranks ran no model:\n{log[-4000:]}")
    return out


def _wait(proc, outs: list, n: int) -> str:
    """The launch's output once it ends, or once it finishes no model for STALL_S (then it is killed)."""
    done, last = 0, time.monotonic()
    while proc.poll() is None:
        now_done = sum((o / f"done{r}").exists() for o in outs for r in range(n))
        errored = any((o / f"error{r}.txt").exists() for o in outs for r in range(n))
        if now_done != done:
            done, last = now_done, time.monotonic()
        if errored or time.monotonic() - last > STALL_S:  # the other ranks would wait for the failed one forever
            time.sleep(0.5)
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return proc.communicate()[0]


def judge(out: Path, model: Path, n: int) -> str | None:
    """Why this run differs from single-process mlx-lm, or None where it does not."""
    result = json.loads((out / "result.json").read_text())
    for i, s in enumerate(SPEC):
        want, want_tokens = reference_logits(model, s["prompt"], steps=s["max_tokens"])
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


def _line(e) -> str:
    return str(e).strip().splitlines()[0][:240] if str(e).strip() else type(e).__name__
