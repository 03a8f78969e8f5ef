"""Every type the pipeline serves, as a tiny random model of 6 query heads over 3 KV heads, split
for tensor mode (`mlx_ring.tensor.cut`) on 2 ranks (KV groups 2 + 1: uneven, so cut by the
standard layouts) and on 3 ranks (1 + 1 + 1: even, so by mlx-lm's own shard() where the type has
one), also 4-bit on 2 ranks: the logits of a prompt and of greedy steps equal the whole model's in
one process within the bound below, and the greedy tokens are the same. A type is admitted for
tensor mode exactly when all these runs pass (a type refused on 2 ranks does not run on 3). An
admitted type split by the layouts runs on 4 ranks too, more ranks than KV heads (query heads 2 + 2
+ 1 + 1, KV head 2 kept by ranks 2 and 3): where that passes, it may share KV heads.
supported.json's `tensor` records what this test finds, with whether the uneven cut and the shared
KV heads were tested for each type, and the test fails where the file says otherwise. The default
model (SmolLM2-135M: 9 heads over 3 KV heads) runs in the same launches: 6 + 3 heads on 2 ranks,
mlx-lm's shard() on 3, 3 + 2 + 2 + 2 on 4 (rank 2 keeps KV heads 1 and 2), 32 greedy tokens equal,
and each rank holds the heads, columns and bytes the planner's `tensor_shares` says. After a change
(mlx-lm, mlx_ring/tensor/), write the record and docs/models.md's list anew with

    MLX_RING_ADMIT=1 ./launch.sh test tests/ring/test_tensor_matrix.py

The bound: a split layer sums N partial products in its all_sum where the whole model sums one
product, so each output is rounded differently (float32: a few parts in 1e7 per sum), and the
difference grows through the layers. max |split - whole| <= 1e-4 * max(1, max |whole|): the 30-layer
default model shows 2e-6 of its largest logit (7e-5 of 38), the tiny models at most 3e-6; a
misplaced head or column moves logits by a whole part of their size.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from mlx_lm.utils import load_tokenizer
from model_zoo import make, tiny_config
from ringutil import ROOT, launch_cmd

from mlx_ring.models import support
from mlx_ring.tensor.shares import tensor_shares

DRIVER = str(ROOT / "tests" / "tensor_driver.py")
PROMPT = [5, 17, 42, 99, 3, 250, 7]
STEPS, DEFAULT_STEPS = 4, 32
BOUND = 1e-4
# seconds a model may take (the default model's 32 steps on a busy 2-core machine)
STALL_S, DEFAULT_STALL_S = 30, 240
# The tiny models' sizes for tensor mode: 3 KV heads split unevenly 2 ways and evenly 3 ways, widths
# of whole 4-bit groups (32) either way, a hidden size of whole groups of 64 (mlx-lm's for routers).
SIZES = {
    "hidden_size": 192,
    "num_attention_heads": 6,
    "num_key_value_heads": 3,
    "intermediate_size": 192,
    "moe_intermediate_size": 192,
    "v_head_dim": 32,
    "head_dim": 32,
}
RUNS = [(2, 0), (2, 4), (3, 0)]  # (ranks, bits), fewer ranks first
SHARED = 4  # ranks of the run with more ranks than KV heads


def variant(kind: str) -> dict:
    """Config changes that give `kind`'s tiny model SIZES, under whatever names its config uses."""

    def pick(config):
        return {k: SIZES[g[0]] for k in config for g in GROUPS if k in g}

    base = tiny_config(kind)
    out = pick(base)
    if isinstance(base.get("text_config"), dict):
        out["text_config"] = pick(base["text_config"])
    return out


# Names of one size (the first is SIZES's), as mlx-lm's types name it.
GROUPS = [
    ["hidden_size", "d_model", "n_embd", "hidden_dim", "model_dim", "block_dim"],
    [
        "num_attention_heads",
        "n_head",
        "n_heads",
        "num_heads",
        "num_query_heads",
        "swa_num_attention_heads",
        "index_n_heads",
    ],
    [
        "num_key_value_heads",
        "num_kv_heads",
        "n_kv_heads",
        "multi_query_group_num",
        "swa_num_key_value_heads",
    ],
    ["intermediate_size", "ffn_hidden_size", "n_inner", "ff_intermediate_size", "block_ff_dim"],
    [
        "moe_intermediate_size",
        "expert_ffn_hidden_size",
        "shared_expert_intermediate_size",
        "shared_intermediate_size",
        "expert_intermediate_size",
    ],
    ["v_head_dim"],
    ["head_dim"],
]  # latent attention's: 3 heads of it fill whole 4-bit groups


def test_every_supported_type_splits_for_tensor_mode_exactly_when_its_runs_pass(
    tmp_path, default_model
):
    found, cases = {}, []
    for kind in sorted(support.SUPPORTED):
        try:
            folders = {
                bits: make(
                    kind, tmp_path / "models" / f"{kind}-{bits}", bits=bits, changes=variant(kind)
                )
                for bits in sorted({b for _, b in RUNS})
            }
        except Exception as e:  # noqa: BLE001 -- any failure to build is the reason this type is refused
            found[kind] = {
                "admitted": False,
                "reason": f"no tiny model of 6 heads over 3 KV heads: {_line(e)}",
                "uneven": False,
            }
            continue
        found[kind] = {"admitted": True, "reason": "", "uneven": False, "shared": False}
        cases += [(kind, n, bits, folders[bits]) for n, bits in [*RUNS, (SHARED, 0)]]
    prompt = load_tokenizer(default_model).encode("The capital of France is")
    for n in sorted({n for n, _ in RUNS} | {SHARED}):
        # A type already refused on fewer ranks runs no more; only a type the layouts
        # split shares KV heads.
        mine = [
            c
            for c in cases
            if c[1] == n and found[c[0]]["admitted"] and (n != SHARED or found[c[0]]["uneven"])
        ]
        mine.append(("default", n, 0, default_model))
        for (kind, _, bits, _), (reason, how) in run_launches(
            tmp_path / f"ranks{n}", n, mine, prompt
        ).items():
            if kind == "default":
                assert reason is None, f"the default model on {n} ranks: {reason}"
                # 3 KV heads: uneven on 2, even on 3, shared on 4
                assert how == ("shard()" if n == 3 else "layouts"), how
                continue
            if n == SHARED:  # a failure here keeps the type to as many ranks as it has KV heads
                found[kind]["shared"] = reason is None
                continue
            found[kind]["uneven"] |= how == "layouts"
            # a 4-bit run with nothing to compare: the others count
            if reason and reason.startswith("unrunnable") and bits:
                continue
            if reason and found[kind]["admitted"]:
                found[kind] = dict(
                    found[kind],
                    admitted=False,
                    reason=f"{n} ranks{f', {bits}-bit' if bits else ''}: {reason}",
                )
    if os.environ.get("MLX_RING_ADMIT") == "1":
        support.write_tensor(found)
    # the planner's view of the split (admitted types only: after the record)
    for n in sorted({n for n, _ in RUNS} | {SHARED}):
        _check_shares(tmp_path / f"ranks{n}" / "default-0", n, default_model)
    recorded = support.load()["tensor"]
    admitted = sorted(k for k, v in found.items() if v["admitted"])
    assert admitted == sorted(recorded["admitted"]), (
        f"admitted now but not recorded: {sorted(set(admitted) - set(recorded['admitted']))}; "
        "recorded but failing now: "
        f"{ {k: found[k]['reason'] for k in set(recorded['admitted']) - set(admitted)} }; see "
        "this file's docstring"
    )

    def flags(v):
        return (v["uneven"], v.get("shared", False))

    assert {k: flags(v) for k, v in found.items() if v["admitted"]} == {
        k: flags(v) for k, v in recorded["admitted"].items()
    }
    assert (ROOT / "docs" / "models.md").read_text().count(support.tensor_list()) == 1


def run_launches(tmp: Path, n: int, cases: list, prompt: list[int]) -> dict:
    """{case: (None or why it failed, how it was cut)}, in as few launches as crashes allow."""
    tmp.mkdir(parents=True)
    left, out = list(cases), {}
    while left:
        outs = [tmp / f"{kind}-{bits}" for kind, _, bits, _ in left]
        for o in outs:
            o.mkdir(exist_ok=True)
        argv = [
            DRIVER,
            "--model",
            *(str(c[3]) for c in left),
            "--out",
            *map(str, outs),
            "--prompt",
            *(json.dumps(prompt if c[0] == "default" else PROMPT) for c in left),
            "--steps",
            *(str(DEFAULT_STEPS if c[0] == "default" else STEPS) for c in left),
            "--stall",
            *(str(DEFAULT_STALL_S if c[0] == "default" else STALL_S) for c in left),
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
                out[case] = judge(o, n)
            elif any((o / f"started{r}").exists() for r in range(n)):
                errors = [
                    (o / f"error{r}.txt").read_text()
                    for r in range(n)
                    if (o / f"error{r}.txt").exists()
                ]
                out[case] = (
                    (_line(errors[0]) if errors else f"the ring stopped in it: {log[-300:]!r}"),
                    "",
                )
            else:
                continue
            left.remove(case)
        if left and not any((o / f"started{r}").exists() for o in outs for r in range(n)):
            raise AssertionError(f"a launch on {n} ranks ran no model:\n{log[-4000:]}")
    return out


def _wait(proc, outs: list, n: int) -> str:
    """The launch's output once it ends, or once a model that failed on some rank has not
    finished on every rank for a while (the others wait in an all_sum): then it is ended."""
    failed_at = None
    while proc.poll() is None:
        stuck = any(
            (o / f"error{r}.txt").exists() and not all((o / f"done{q}").exists() for q in range(n))
            for o in outs
            for r in range(n)
        )
        failed_at = (failed_at or time.monotonic()) if stuck else None
        if failed_at and time.monotonic() - failed_at > 10:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    return proc.communicate()[0]


def judge(o: Path, n: int) -> tuple[str | None, str]:
    """(why the split run differs from the whole model, or None; how it was cut)."""
    refused = [
        (o / f"refused{r}.txt").read_text() for r in range(n) if (o / f"refused{r}.txt").exists()
    ]
    if refused:
        # every rank decides alike
        assert len(refused) == n, f"only some ranks refused {o.name}: {refused}"
        return refused[0].split(": ", 1)[-1].rsplit("; use PARALLEL", 1)[0], ""
    # mlx-lm's own model fails on the tiny model (seed_oss's 4-bit)
    if (o / "unrunnable0.txt").exists():
        return (
            "unrunnable: mlx-lm's whole model fails in one process: "
            f"{_line((o / 'unrunnable0.txt').read_text())}"
        ), ""
    errors = [(o / f"error{r}.txt").read_text() for r in range(n) if (o / f"error{r}.txt").exists()]
    if errors:
        return _line(errors[0]), (o / "how0.txt").read_text() if (o / "how0.txt").exists() else ""
    want, want_tokens = np.load(o / "want.npy"), json.loads((o / "want.json").read_text())
    if not np.isfinite(want).all():
        return "the whole model's logits are not finite for the tiny model", ""
    how = (o / "how0.txt").read_text()
    bound = BOUND * max(1.0, float(np.abs(want).max()))
    for r in range(n):
        got = np.load(o / f"got{r}.npy")
        err = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
        if not err <= bound:
            return (
                f"rank {r}'s logits differ from the whole model's by {err:.3g} (bound {bound:.3g})",
                how,
            )
        # Tokens must agree up to the first step whose two best logits lie within the bound
        # (a tie either way).
        top2 = -np.sort(-want, axis=1)[:, :2]
        sure = next((i for i, (a, b) in enumerate(top2) if a - b <= 2 * bound), len(want))
        # the split model's own greedy tokens, while they agree
        tokens = got.argmax(axis=1).tolist()
        if tokens[:sure] != want_tokens[:sure]:
            return (
                f"rank {r}'s greedy tokens {tokens} differ from the whole model's {want_tokens}",
                how,
            )
    return None, how


def _check_shares(o: Path, n: int, model: Path) -> None:
    """What each rank of the split default model holds is what the planner's tensor_shares says."""
    shares = tensor_shares(json.loads((model / "config.json").read_text()), n)
    for r, want in enumerate(shares):
        got = json.loads((o / f"share{r}.json").read_text())
        assert (got["heads"], got["kv_heads"], got["columns"]) == (
            want.heads,
            want.kv_heads,
            want.columns,
        ), (r, got, want)
        assert got["bytes"] / got["whole"] == pytest.approx(want.fraction, rel=0.01), (r, got, want)


def _line(e) -> str:
    return str(e).strip().splitlines()[0][:240] if str(e).strip() else type(e).__name__


@pytest.fixture(autouse=True)
def _record_has_tensor():
    if "tensor" not in support.load() and os.environ.get("MLX_RING_ADMIT") != "1":
        pytest.fail("supported.json has no tensor record yet; run this test with MLX_RING_ADMIT=1")
