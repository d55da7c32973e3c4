"""The replay's model of a tensor core's fused add (probes/order_replay.py: FUSED, evaluate)
checked independently, bit for bit, against MMA-Sim (Xie et al., arXiv 2511.10909; PyPI
``mmasim``, a test dependency only), a CPU model of NVIDIA's and AMD's matrix units: Hopper's wgmma, fp16 and
bf16 operands, fp32 accumulation, the accumulator's bits compared before any output rounding, on
the probe's own draws and on general operands (issue 48). One fused group of 16 products with
the running sum, and the whole K = 4096 chain the H200 revealed (order-id f05c9cdb73a9)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from matmul_drift.core import trees
from matmul_drift.measure import inputs
from matmul_drift.probes import order, order_plan, order_replay
from matmul_drift.store import catalog

try:
    from mmasim import nv_ptx  # builds a small C++ extension once (torch cpp_extension, ninja)
except (ImportError, OSError, RuntimeError) as exc:  # not installed (pip install -e .[test]), or no C++ compiler
    (pytest.fail if os.environ.get("CI") else pytest.skip)(f"mmasim cannot be imported ({type(exc).__name__}: {exc})", allow_module_level=True)

HOPPER = "hopper/blackwell: aligned to the exponent sum, 25 bits, cut toward zero"
H200_CHAIN = "f05c9cdb73a9"  # seed[:, :46000] fp16 on the H200 (torch 2.11.0+cu130): 256 fused groups of 16
DRAWS = 10_000
# The K = 4096 chain's draws: each is 256 fused groups, so these are a million groups a kind and
# dtype, a hundred times the one-group test's DRAWS (which holds every group's arithmetic); the
# special kind keeps inf, -inf or NaN in about 3 draws in 100 and zeros and subnormals in 2 of
# 100 operands each.
CHAIN_DRAWS = 4_000
KINDS = ("probe", "normal", "spread", "special")
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
PTX = {"float16": "f16", "bfloat16": "bf16"}
GROUP = [[16, 17], *range(16)]  # 16 products and the running sum (a child node: c + 0)


def wgmma(dtype: str):
    return nv_ptx.WGMMA("Hopper", f"m64n8k16.f32.{PTX[dtype]}.{PTX[dtype]}")


def simulated(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: str) -> np.ndarray:
    """MMA-Sim's fp32 accumulator of wgmma's dpa over K (groups of 16, the running sum c):
    a, b (draws, K) holding ``dtype`` values, c (draws,) float32 values. On one thread: its many
    small steps took 10 to 40 times as long on two where the cores were shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = wgmma(dtype).dpa(torch.from_numpy(a).to(TORCH[dtype]), torch.from_numpy(b).to(TORCH[dtype]),
                               torch.from_numpy(np.asarray(c, np.float32)))
    finally:
        torch.set_num_threads(threads)
    return out.numpy()


def bits(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def _in(x: np.ndarray, dtype: str) -> np.ndarray:
    """x (float64) as ``dtype`` values, back in float64."""
    return torch.from_numpy(np.ascontiguousarray(x)).to(TORCH[dtype]).double().numpy()


def _f32(x) -> np.ndarray:
    return np.asarray(x, np.float64).astype(np.float32).astype(np.float64)


def operands(kind: str, rng: np.random.Generator, k: int, draws: int, dtype: str, with_sum: bool):
    """(a, b, c): a and b (draws, k) holding ``dtype`` values, c (draws,) the running sum, float32
    values (0 without ``with_sum``). ``kind``: "probe" the replay's own draws
    (order_replay.draw_products over a power of two, order.replay); "normal" N(0, 1) operands,
    as a model's; "spread" random significands over every exponent of fp16 (subnormals and
    zeros included), of bf16 from 2^-140 (subnormals, zeros) to 2^60 (products within
    float32's range mostly); "special" normal ones with zeros, subnormals and, in about one
    draw in 60, inf, -inf or NaN."""
    shape = (draws, k)
    c = np.zeros(draws)
    if kind == "probe":
        p = order_replay.draw_products(rng, k + 1, draws, dtype)
        shared = rng.choice([-1.0, 1.0], shape) * np.exp2(rng.integers(-2, 3, shape))
        a, b = _in(shared, dtype), _in(p[:k].T / shared, dtype)
        if with_sum:
            c = p[k]
    elif kind == "normal":
        a, b = _in(rng.standard_normal(shape), dtype), _in(rng.standard_normal(shape), dtype)
        if with_sum:
            c = _f32(4 * rng.standard_normal(draws))
    elif kind == "spread":
        if dtype == "float16":  # every finite encoding alike
            a, b = (torch.from_numpy(((rng.integers(0, 2, shape) << 15) | (rng.integers(0, 31, shape) << 10)
                                      | rng.integers(0, 1024, shape)).astype(np.uint16).view(np.int16))
                    .view(torch.float16).double().numpy() for _ in range(2))
        else:
            a, b = (_in(rng.choice([-1.0, 1.0], shape) * (1 + rng.integers(0, 128, shape) / 128)
                        * np.exp2(rng.integers(-140, 60, shape)), dtype) for _ in range(2))
        if with_sum:
            c = _f32(rng.choice([-1.0, 1.0], draws) * (1 + rng.random(draws)) * np.exp2(rng.integers(-140, 40, draws)))
    else:  # special
        a, b = rng.standard_normal(shape), rng.standard_normal(shape)
        tiny = 2.0**-24 if dtype == "float16" else 2.0**-133
        rare = 0.016 / k / 3
        for x in (a, b):
            u = rng.random(shape)
            x[u < 0.02] = 0.0
            x[(u >= 0.02) & (u < 0.04)] *= 8 * tiny  # subnormal
            for n, v in enumerate((np.inf, -np.inf, np.nan)):
                x[(u >= 0.04 + n * rare) & (u < 0.04 + (n + 1) * rare)] = v
        a, b = _in(a, dtype), _in(b, dtype)
        if with_sum:
            c = _f32(rng.standard_normal(draws))
            c[rng.random(draws) < 0.1] = 0.0
    return a, b, c


def replayed(tree, a, b, dtype: str, c=None, fused=HOPPER, with_operands=True) -> np.ndarray:
    """order_replay.evaluate's fp32 sums along ``tree`` of a * b ((draws, k), ``dtype`` values),
    and c (a leaf of the running sum's child node, GROUP) where given, each product aligned by its
    operands' exponents (``with_operands``) or read as a float32 value alone."""
    with np.errstate(invalid="ignore"):  # inf * 0: NaN, as the hardware's
        values = (a * b).T
    exps = order_replay.product_exponents(a, b, dtype).T if with_operands else None
    if c is not None:
        values = np.concatenate([values, np.asarray(c, np.float64)[None], np.zeros((1, len(c)))])
        exps = None if exps is None else np.concatenate([exps, np.zeros((2, len(c)), np.int16)])
    return order_replay.evaluate(tree, values, np.float32, fused, exps)


def _old_rule(a, b, c=None) -> np.ndarray:
    """The fused add the replay modelled before (``truncated-26``, F = 25 in MMA-Sim's counting)
    of the products a * b and the running sum c (None: the first group, none): the products
    rounded to float32, every term cut toward zero to 26 bits below the LARGEST TERM's leading
    bit (not the exponent sum), the sum cut toward zero to float32 (FLT_MAX, not inf, beyond it;
    -0 and NaN's bits as numpy leaves them)."""
    with np.errstate(all="ignore"):
        terms = (a * b).T.astype(np.float32)
        if c is not None:  # the running sum's node, c + 0
            terms = np.concatenate([np.asarray(c, np.float32)[None] + np.float32(0), terms])
        terms = terms.astype(np.float64)
        _, e = np.frexp(np.max(np.abs(terms), axis=0))
        scale = (26 - e)[None, :]
        s = np.ldexp(np.trunc(np.ldexp(terms, scale)), -scale).sum(axis=0)
        out = s.astype(np.float32)
        over = np.abs(out.astype(np.float64)) > np.abs(s)
    out[over] = np.nextafter(out[over], np.float32(0))
    return out


def test_mmasims_hopper_is_the_model_the_replay_names():
    """The words name MMA-Sim's own parameters for Hopper's wgmma (fp16 and bf16 into fp32): F,
    e_zero, a fused group of 16 (32 bytes) and the sum cut toward zero; the old "truncated-P"
    counted one bit more (P = F + 1)."""
    assert HOPPER in order_replay.FUSED and "exact" in order_replay.FUSED
    assert not any("truncated" in way for way in order_replay.FUSED)
    for dtype in TORCH:
        op = wgmma(dtype).arithmetic_op
        assert (op.F, op.e_zero) == order_replay.TENSOR_CORES[HOPPER] == (25, -133)
        assert (op.L_max, op.rho) == (16, "RZ-FP32")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_fused_group_with_the_running_sum_is_mmasims_bit_for_bit(dtype, kind):
    rng = np.random.default_rng(48)
    a, b, c = operands(kind, rng, 16, DRAWS, dtype, with_sum=True)
    want = simulated(a, b, c, dtype)
    got = replayed(GROUP, a, b, dtype, c)
    bad = np.flatnonzero(bits(got) != bits(want))
    assert bad.size == 0, (f"{bad.size} of {DRAWS} draws differ; first: a={a[bad[0]].tolist()} "
                           f"b={b[bad[0]].tolist()} c={c[bad[0]]!r}: {got[bad[0]]!r} vs MMA-Sim {want[bad[0]]!r}")
    # the draws reach what each kind is for
    finite = np.isfinite(want)
    assert finite.mean() > 0.9 and (want[finite] != 0).mean() > 0.9
    if kind != "probe":  # somewhere the largest exponent sum's significands multiply past 2
        e = order_replay.product_exponents(a, b, dtype)
        with np.errstate(invalid="ignore"):
            at_max = (e == e.max(axis=1, keepdims=True)) & (np.abs(a * b) >= np.exp2(e.astype(float) + 1))
        assert at_max.any(axis=1).mean() > 0.1
    if kind in ("spread", "special"):
        # subnormals
        assert (order_replay.exponents(a, dtype) > np.floor(np.log2(np.abs(a) + (a == 0)))).any()
        assert (a == 0).any()
    if kind == "special":
        assert (~finite).sum() > 50 and np.isnan(want).sum() > 10


@pytest.fixture(scope="module")
def h200_chain():
    root = Path(__file__).resolve().parents[1] / "results" / "catalog"
    entry = catalog.load(root, "orders", int(H200_CHAIN, 16))
    tree = entry["tree"]
    nodes = trees.inner_nodes(tree)
    # sequential in 256 fused groups of 16, each with the running sum: wgmma's dpa over K
    assert entry["k"] == 4096 and len(nodes) == 256 and all(len(x) == 17 for x in nodes[:-1]) and len(nodes[-1]) == 16
    return tree


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_h200s_k4096_chain_is_mmasims_bit_for_bit(h200_chain, dtype, kind):
    """Every fused group of 16 with the running sum, as MMA-Sim's dpa goes over K from c = 0;
    CHAIN_DRAWS draws in batches."""
    batch, seen, inexact = 2000, 0, 0
    for n in range(CHAIN_DRAWS // batch):
        rng = np.random.default_rng([48, n])
        a, b, c = operands(kind, rng, 4096, batch, dtype, with_sum=False)
        want = simulated(a, b, c, dtype)
        got = replayed(h200_chain, a, b, dtype)
        bad = np.flatnonzero(bits(got) != bits(want))
        assert bad.size == 0, (f"batch {n}: {bad.size} of {batch} draws differ; first: {got[bad[0]]!r} "
                               f"vs MMA-Sim {want[bad[0]]!r}")
        seen += batch
        if n == 0:  # the cuts show in the first batch alone (nearly every draw), past what is asked
            with np.errstate(invalid="ignore"):
                exact = order_replay.evaluate(h200_chain, (a * b).T, np.float32, "exact")
            inexact += int((bits(exact) != bits(want)).sum())
    assert seen == CHAIN_DRAWS
    assert inexact > (0 if kind == "probe" else DRAWS // 100)  # the cuts show: an exact fused add differs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_old_rule_fails_where_it_did_and_matched_the_probes_own_draws(dtype):
    """The fused add the replay modelled before (truncated-26: aligned to the largest term's own
    magnitude, the products rounded to float32) matched MMA-Sim on every one of the probe's draws,
    where one operand of each product is a power of two, which is why the H200's replay passed
    with it, and differed on general operands (the comment above order_replay.TENSOR_CORES)."""
    counts = {}
    for kind in KINDS:
        a, b, c = operands(kind, np.random.default_rng(48), 16, DRAWS, dtype, with_sum=True)
        want = simulated(a, b, c, dtype)
        counts[kind] = int((bits(_old_rule(a, b, c)) != bits(want)).sum())
        assert int((bits(replayed(GROUP, a, b, dtype, c)) != bits(want)).sum()) == 0, kind
    assert counts["probe"] == 0, counts
    assert all(counts[kind] > DRAWS // 200 for kind in ("normal", "spread", "special")), counts
    # the products alone do not say it: read as a float32 value each, the model fails there too
    a, b, c = operands("normal", np.random.default_rng(48), 16, DRAWS, dtype, with_sum=True)
    alone = replayed(GROUP, a, b, dtype, c, with_operands=False)
    assert (bits(alone) != bits(simulated(a, b, c, dtype))).sum() > DRAWS // 200


def _group(products, c=0.0):
    """a, b (1, 16) and c (1,) from up to 16 (a, b) pairs, the rest 0 x 0."""
    a, b = np.zeros((1, 16)), np.zeros((1, 16))
    for i, (x, y) in enumerate(products):
        a[0, i], b[0, i] = x, y
    return a, b, np.array([c])


# (name, dtype, products (a, b), what MMA-Sim says, what the old rule said)
CASES = [
    # 1.5 x 1.5 = 2.25 aligns by exponent 0, not 1: eight 1.5 x 2^-25 keep 2^-25 each
    ("exponent sum", "float16", [(1.5, 1.5)] + [(1.5 * 2.0**-12, 2.0**-13)] * 8, 2.25 + 2.0**-22, 2.25),
    # zeros align at e_zero = -133: a bit below 2^-158 is cut, so a negative term rises; the old
    # rule rounded these bf16 products to float32 (subnormal) first
    ("e_zero, subnormal products", "bfloat16",
     [(2.0**-75 * (1 + 2.0**-7), 2.0**-74 * (1 + 2.0**-7)), (2.0**-75 * (1 + 2.0**-7), 2.0**-74 * (1 - 2.0**-7)),
      (-(2.0**-78), 2.0**-77)], 2.0**-149, 2.0**-148),
    # cut to 24 bits the sum is still 2^128 or more: inf, not FLT_MAX
    ("overflow", "bfloat16", [(1.5 * 2.0**64, 2.0**63)] * 2, np.inf, float(np.finfo(np.float32).max)),
    # a subnormal operand reads as 0.m x 2^-14: 2^-24 x 2^15 aligns by exponent 1, not -9, so
    # the other product's last bit (2^-29) is cut
    ("subnormal operand", "float16", [(2.0**-24, 2.0**15), ((1 + 2.0**-10) * 2.0**-5, (1 + 2.0**-10) * 2.0**-4)],
     2.0**-8 + 2.0**-18, 2.0**-8 + 2.0**-18 + 2.0**-29),
]


@pytest.mark.parametrize("name, dtype, products, mmasim, old", CASES, ids=[c[0] for c in CASES])
def test_by_hand_where_the_old_rule_and_mmasim_part(name, dtype, products, mmasim, old):
    a, b, c = _group(products)
    assert np.all(_in(a, dtype) == a) and np.all(_in(b, dtype) == b), "operands exact in the dtype"
    want = simulated(a, b, c, dtype)
    assert bits(want) == bits(np.float32(mmasim)), (want, mmasim)
    assert bits(replayed(list(range(16)), a, b, dtype)) == bits(want)  # the first group: no running sum, c = 0
    assert bits(replayed(GROUP, a, b, dtype, c)) == bits(want)
    assert bits(_old_rule(a, b)) == bits(np.float32(old)) != bits(want)


def test_nan_is_the_hardwares_one_nan():
    a, b, c = _group([(np.inf, 1.0), (-np.inf, 1.0), (1.0, 1.0)])
    want = simulated(a, b, c, "float16")
    assert bits(want)[0] == bits(replayed(GROUP, a, b, "float16", c))[0] == 0x7FFFFFFF
    assert bits(_old_rule(a, b, c))[0] != 0x7FFFFFFF


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_replay_names_hopper_for_a_kernel_that_is_mmasim(h200_chain, dtype, monkeypatch):
    """order.replay, with the operands it writes, against a kernel that is MMA-Sim's wgmma along
    the H200's chain (the output rounded to ``dtype``): 100 of 100 draws, and the words for
    Hopper alone match; on general operands (evaluate, the exponents given) the accumulator's
    bits tell Hopper from every other way."""
    from matmul_drift.core import cases

    tree = h200_chain
    t = order_plan.target(cases.adhoc(1, 4096, 16), dtype, "cpu")

    def kernel(self):
        a = self.a0[t.row].double().numpy()[None, :].repeat(16, axis=0)
        out = simulated(a, self.b0.double().numpy().T, np.zeros(16), dtype)
        return torch.from_numpy(inputs.round_bits(out, dtype).astype(np.int16)).view(TORCH[dtype])

    monkeypatch.setattr(order.Prober, "product", kernel)
    got = order.replay(t, tree, draws=100, width=16)
    assert got["matched"] == 100 and got["fused_add"] == [HOPPER], got  # the probe's draws tell the ways apart
    a, b, _ = operands("normal", np.random.default_rng(5), 4096, 400, dtype, with_sum=False)
    acc = simulated(a, b, np.zeros(400), dtype)
    for way in order_replay.FUSED:
        same = bits(replayed(tree, a, b, dtype, fused=way)) == bits(acc)
        assert same.all() == (way == HOPPER), (way, int(same.sum()))
