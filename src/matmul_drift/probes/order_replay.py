"""The replay's arithmetic: a tree's sum of exact products evaluated in numpy, as the kernel's
accumulator would round it, and matched bit for bit against the kernel's outputs. No torch:
order.py's ``replay`` draws the inputs on the kernel and hands the products here.

Tensor cores add a group of products and the running sum in one fused add that cuts every
term to a fixed width below the largest exponent among them (Fasi et al., PeerJ CS 2021; bit
for bit, MMA-Sim's rule: Xie et al., arXiv 2511.10909, and ``FUSED``).
"""

from __future__ import annotations

import math

import numpy as np

from matmul_drift.core import trees
from matmul_drift.measure import inputs
from matmul_drift.probes.order_plan import PROBE


# How a fused node rounds, tried in this order by the replay: "exact" (summed exactly, rounded
# to nearest once: a CPU's), or a tensor core's fused add into a float32 accumulator as MMA-Sim
# models it bit for bit (Xie et al., arXiv 2511.10909; `t_fdpa` in mmasim/arithmetic/fdpa.py):
# each product aligned by the sum of its operands' exponents, every term cut toward zero to F
# bits below the largest exponent (and e_zero), the sum cut toward zero to float32. F and e_zero
# are MMA-Sim's (mmasim/nv_ptx/sim.py); docs/design.md "The order tree format" has the whole rule.
TENSOR_CORES = {  # name -> (F, e_zero), float32 output
    # Fasi et al.'s "24" on V100
    "volta: aligned to the exponent sum, 23 bits, cut toward zero": (23, -131),
    "turing/ampere/ada: aligned to the exponent sum, 24 bits, cut toward zero": (24, -132),
    # the H200's
    "hopper/blackwell: aligned to the exponent sum, 25 bits, cut toward zero": (25, -133),
}
FUSED = ("exact", *TENSOR_CORES)

# a format's least normal exponent: its subnormals are read as 0.m x 2^this
LEAST_NORMAL_EXPONENT = {"float16": -14, "bfloat16": -126, "float32": -126}


def exponents(x: np.ndarray, dtype: str) -> np.ndarray:
    """The exponent a tensor core reads from each value of ``dtype`` in ``x`` (float64): e with
    2^e <= |x| < 2^(e+1), but never below the format's least normal exponent (a subnormal is
    0.m x 2^that); int16. Zeros, inf and NaN get that least one too (a fused add places zeros
    itself; inf and NaN decide the sum whatever their exponent)."""
    _, e = np.frexp(x)
    return np.maximum(e - 1, LEAST_NORMAL_EXPONENT[dtype]).astype(np.int16)


def product_exponents(a: np.ndarray, b: np.ndarray, dtype: str) -> np.ndarray:
    """The exponent a tensor core aligns each product a * b by (operands of ``dtype``, as float64,
    broadcast together): the sum of the operands' exponents, not the product's own; int16."""
    return exponents(a, dtype) + exponents(b, dtype)


def truncated_sum(terms: np.ndarray, exps: np.ndarray, bits: int, zero: int) -> np.ndarray:
    """A tensor core's fused add (``FUSED``, MMA-Sim's ``t_fdpa``) of ``terms`` (shape (n, draws),
    float64, exact: products of the operands and the running sum), each aligned by its exponent in
    ``exps`` (product_exponents; a zero's is ``zero``): per draw every term cut toward zero to a
    multiple of 2^(e_max - bits), e_max the largest exponent and ``zero``, the cut terms summed
    exactly, the sum cut toward zero to float32: inf at 2^128 and beyond, +0 for zero, NaN as
    0x7fffffff. Returns float32 (draws,)."""
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN go through as IEEE says
        # e_max, at least `zero`
        e = np.where(terms == 0, zero, exps).max(axis=0, initial=zero).astype(np.int32)
        scale = (bits - e)[None, :]
        cut = np.ldexp(np.trunc(np.ldexp(terms, scale)), -scale)
        # exact: multiples of 2^(e_max - bits), n of them each below 2^(e_max + 2)
        s = cut.sum(axis=0)
        out = s.astype(np.float32)
        over = np.abs(out.astype(np.float64)) > np.abs(s)  # rounded away from zero: one step back
        out[over] = np.nextafter(out[over], np.float32(0))
        # cut to 24 bits, still beyond float32: inf (MMA-Sim, the hardware)
        big = np.abs(s) >= 2.0**128
        out[big] = np.copysign(np.float32(np.inf), s[big]).astype(np.float32)
    out += np.float32(0)  # -0 to +0
    out.view(np.uint32)[np.isnan(out)] = 0x7FFFFFFF
    return out


def exact_sum(terms: np.ndarray, acc: np.dtype) -> np.ndarray:
    """The exact sum of ``terms`` (shape (n, draws), float64) per draw, rounded once to ``acc``;
    a draw holding inf or NaN sums as IEEE says (inf, or NaN for inf - inf), where fsum raises."""
    finite = np.isfinite(terms).all(axis=0)
    with np.errstate(invalid="ignore"):
        out = terms.sum(axis=0)
    out[finite] = [math.fsum(col) for col in terms[:, finite].T]
    with np.errstate(over="ignore"):
        return out.astype(acc)


def evaluate(tree, values: np.ndarray, acc: np.dtype, fused: str = "exact",
             exps: np.ndarray | None = None) -> np.ndarray:
    """The tree's sum of ``values`` (products, shape (k, draws), exact in ``acc``), each two-child
    node one rounded addition in ``acc``, each larger node one fused add as ``fused`` (one of
    ``FUSED``; a tensor core's only with a float32 accumulator) says. A tensor core aligns a
    product by its operands' exponents: ``exps`` ((k, draws), product_exponents of the operands);
    without it each product is read as a float32 value times 1 (its own exponent), which is what
    the operands give where one of them is a power of two and both are normal. A tensor core's
    fused add takes the products exactly (float64), also beyond float32's range."""
    acc = np.dtype(acc)
    tc = TENSOR_CORES.get(fused)
    if tc is None and fused != "exact":
        raise ValueError(f"{fused!r} is not one of {', '.join(FUSED)}")
    if tc is not None and acc != np.float32:
        raise ValueError(f"{fused} is a float32 accumulator's fused add, not {acc}'s")
    memo: dict[int, np.ndarray] = {}
    stack = [(tree, False)]
    while stack:
        node, done = stack.pop()
        if not isinstance(node, list):
            continue
        if not done:
            stack.append((node, True))
            stack.extend((c, False) for c in node if isinstance(c, list))
            continue
        if len(node) > 2 and tc is not None:  # the products exact, each with its alignment exponent
            terms = np.stack([memo.pop(id(c)).astype(np.float64) if isinstance(c, list)
                              else np.asarray(values[c], dtype=np.float64) for c in node])
            # the running sum's; a product's where no exps are given
            own = exponents(terms, "float32")
            if exps is not None:
                leaf = [i for i, c in enumerate(node) if not isinstance(c, list)]
                own[leaf] = exps[[node[i] for i in leaf]]
            memo[id(node)] = truncated_sum(terms, own, *tc)
            continue
        kids = [values[c].astype(acc) if not isinstance(c, list) else memo.pop(id(c)) for c in node]
        if len(kids) == 2:
            memo[id(node)] = (kids[0] + kids[1]).astype(acc)
        else:
            memo[id(node)] = exact_sum(np.stack(kids).astype(np.float64), acc)
    return memo[id(tree)] if isinstance(tree, list) else values[tree].astype(acc)


def draw_products(rng: np.random.Generator, k: int, draws: int, dtype: str) -> np.ndarray:
    """(k, draws) products, exact in the accumulator, that tell summation orders apart even
    through an fp16 or bf16 output: in each draw +L and -L at two random places (FPRev's pair,
    L = 2^13 for an fp32 accumulator, 2^26 for fp64), the others 4-bit values of 1/4 to 16 units
    in L's last place (2^-10, 2^-26), random signs. A product that meets a partial sum holding
    L is rounded to that place, one that does not is kept; once the pair cancels the sum is
    small, so the output's own rounding keeps what the order did. (Values spread over many
    exponents, the draws before, let the largest decide: every tree matched an fp16 kernel.)"""
    acc = PROBE[dtype][0]
    big = 2.0**13 if acc == 24 else 2.0**26
    unit = big * 2.0 ** (1 - acc)
    # in place below: a few k x draws arrays at most (memory.probe_bytes)
    out = rng.choice([-unit, unit], (k, draws))
    out *= 1 + rng.integers(0, 8, (k, draws)) / 8
    out *= np.exp2(rng.integers(-2, 4, (k, draws)))
    for d in range(draws):
        i, j = rng.choice(k, 2, replace=False)
        out[i, d], out[j, d] = big, -big
    return out


def match(tree, products: np.ndarray, kernel: list[tuple[int, float]], dtype: str,
          exps: np.ndarray | None = None) -> dict:
    """The tree's sums of ``products`` ((k, draws), exact in the accumulator; ``exps``, where
    given, the sums of their operands' exponents: product_exponents) against the
    kernel's outputs (bits, value) in ``dtype``: draws, matched and the first mismatch (under
    the first way that matches most draws), and fused_add: for a tree with fused nodes, every
    way of FUSED (fp32 accumulators; fp64 rounds exactly) that matches every draw, often
    more than one where the output's rounding hides the accumulator's; None for a tree of
    two-child nodes."""
    acc = np.float64 if dtype == "float64" else np.float32
    fused = trees.fused_nodes(tree) > 0
    best, ways = None, []
    for way in FUSED if fused and acc is np.float32 else FUSED[:1]:
        want = evaluate(tree, products, acc, way, exps)  # every draw at once
        want_bits = want.view(np.uint64) if acc is np.float64 else inputs.round_bits(want, dtype)
        matched, first = 0, None
        for i, ((bits, value), w) in enumerate(zip(kernel, want_bits)):
            if int(w) == bits:
                matched += 1
            elif first is None:
                first = {"draw": i, "kernel": value, "tree": float(want[i])}
        if best is None or matched > best["matched"]:
            best = {"draws": len(kernel), "matched": matched, "first_mismatch": first}
        if matched == len(kernel):
            ways.append(way)
    return {**best, "fused_add": ways if fused else None}
