"""Metrics against known truths: exact products, the γ_K bound, independent drift sums."""

import os
import subprocess
import sys
from pathlib import Path

import kernel_names
import numpy as np
import pytest
import torch

from matmul_drift.core import cases, numerics, routes
from matmul_drift.core.cases import Case, Shape
from matmul_drift.jobs import selection, suite
from matmul_drift.jobs.selection import Cell
from matmul_drift.measure import kernels, measure
from matmul_drift.store import catalog

CPU_DTYPES = ("float64", "float32", "float16", "bfloat16")


@pytest.fixture(scope="module")
def cpu_suite(tmp_path_factory):
    """The whole default CPU suite, measured once, as asv's setup_cache does, less the order
    probe, the fix finder and the maps (tests/test_order.py, test_fixfind.py, test_map.py,
    test_reuse.py and test_asv.py run them): where neither fp16 nor bf16 is native the first
    two took 850 of this fixture's 960 s."""
    root = tmp_path_factory.mktemp("catalog")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(selection.ORDERS_VAR, "0")
        mp.setenv(selection.FIXES_VAR, "0")
        mp.setenv(selection.MAPS_VAR, "0")
        got = suite.measure_all(devices=("cpu",), root=root, case_ids=cases.CASE_IDS)
    return got, root


@pytest.mark.parametrize("dtype", CPU_DTYPES)
def test_error_is_zero_on_exact_integers(dtype):
    # Integers in [-2, 2] with K = 32: every partial sum is an integer below 2^7, exact in
    # every dtype, so any correct kernel returns the exact product.
    case = Case("exact", "mm", Shape(16, 32, 24), Shape(16, 32, 24), dist="int", slice_n=(5,), slice_m=(3,))
    m = measure.measure(case, dtype, "cpu", with_kernels=False, timing=False)
    assert m.error_u == 0.0
    assert m.slice_n[0]["max_ulp"] == 0 and m.slice_m[0]["max_ulp"] == 0


def test_error_within_gamma_bound_on_every_cpu_case(cpu_suite):
    got, _ = cpu_suite
    checked = 0
    for key, values in got.items():
        assert "error" not in values, (key, values)
        if "skip" in values or np.isnan(values["gamma_k_u"]):
            continue
        assert values["error_u"] <= values["gamma_k_u"], key
        checked += 1
    assert checked >= 20  # most CPU cases carry a bound


def test_cuda_and_tf32_are_skipped_on_cpu(cpu_suite):
    got, _ = cpu_suite
    assert "skip" in got[Cell("square", "float32-tf32", "cpu")]
    if not torch.cuda.is_available():
        assert "skip" in suite.measure_all(case_ids=("square",), precisions=("float32",), devices=("cuda",))[
            Cell("square", "float32", "cuda")
        ]


def test_precisions_are_measured_as_selected_and_in_that_order(monkeypatch, tmp_path):
    monkeypatch.setenv(selection.PRECISIONS_VAR, "float16,float32-tf32,flot32")
    with pytest.raises(ValueError, match=r"MATMUL_DRIFT_PRECISIONS names unknown precisions: flot32; known precisions: "
                                         r"float64, float32, float16, bfloat16, float32-tf32, float32-high$"):
        selection.read().precisions
    monkeypatch.setenv(selection.PRECISIONS_VAR, " bfloat16, float64 ")
    assert selection.read().precisions == ("bfloat16", "float64")
    for value, on in (("", True), ("1", True), (" 0 ", False)):
        monkeypatch.setenv(selection.FIXES_VAR, value)
        assert selection.read().fixes is on
    monkeypatch.setenv(selection.ORDERS_VAR, "off")  # refused, not read as on
    with pytest.raises(ValueError, match=r"^\$MATMUL_DRIFT_ORDERS is 0 \(off\) or 1 \(on\), not 'off'$"):
        selection.read()
    monkeypatch.setenv(selection.ORDERS_VAR, "0")
    monkeypatch.setenv(selection.MAPS_VAR, "no")
    with pytest.raises(ValueError, match=r"^\$MATMUL_DRIFT_MAPS is 0 \(off\) or 1 \(on\), not 'no'$"):
        selection.read()
    monkeypatch.setenv(selection.MAPS_VAR, "0")
    monkeypatch.setenv(selection.FIXES_VAR, "0")
    got = suite.measure_all(case_ids=("bmm",), devices=("cpu",), root=tmp_path)
    assert list(got) == [Cell("bmm", p, "cpu") for p in ("bfloat16", "float64")]
    with pytest.raises(NotImplementedError, match="not measured"):
        suite.lookup(got, "bmm", "float32", "cpu")
    with pytest.raises(NotImplementedError, match="not selected"):
        suite.timed_call("bmm", "float32", "cpu")
    monkeypatch.delenv(selection.PRECISIONS_VAR)
    assert selection.read().precisions == cases.PRECISIONS


def test_no_measurement_starts_once_the_budget_is_spent(monkeypatch, tmp_path):
    for bad in ("0", "-1", "nan", "inf", "ten"):
        monkeypatch.setenv(selection.BUDGET_VAR, bad)
        with pytest.raises(ValueError, match="MATMUL_DRIFT_BUDGET must be a positive number"):
            selection.read()
    monkeypatch.setenv(selection.BUDGET_VAR, "0.001")  # the first starts at once and takes longer than 1 ms
    monkeypatch.setenv(selection.ORDERS_VAR, "0")
    monkeypatch.setenv(selection.FIXES_VAR, "0")
    monkeypatch.setenv(selection.MAPS_VAR, "0")
    got = suite.measure_all(case_ids=("bmm",), precisions=("float32", "float64"), devices=("cpu",), root=tmp_path)
    first, second = got[Cell("bmm", "float32", "cpu")], got[Cell("bmm", "float64", "cpu")]
    assert "skip" not in first and first["error_u"] >= 0
    assert second == {"skip": "not measured: the budget of 0.001 s ($MATMUL_DRIFT_BUDGET) was spent"}


def _huge_kib(array) -> int:
    """AnonHugePages (KiB) of the mappings that hold ``array``, from /proc/self/smaps (numpy's
    advice splits one allocation into several)."""
    start, stop, huge, inside = array.ctypes.data, array.ctypes.data + array.nbytes, 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if "-" in head[0] and ":" not in head[0]:
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = lo < stop and start < hi
        elif inside and head[0] == "AnonHugePages:":
            huge += int(head[1])
    return huge


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="reads Linux's /proc/self/smaps")
@pytest.mark.skipif(measure.memory.huge_page_switch() is None, reason="this numpy has no huge-page switch")
def test_measuring_draws_its_operands_in_small_pages_and_restores_numpys_advice(monkeypatch, tmp_path):
    advise = measure.memory.huge_page_switch()

    def advised() -> bool:
        state = advise(True)
        advise(state)
        return state

    seen = []
    monkeypatch.setattr(suite, "_measure_one", lambda *a: (seen.append(advised()), ({"skip": "-"}, "skip"))[1])
    for env in (selection.ORDERS_VAR, selection.FIXES_VAR, selection.MAPS_VAR):
        monkeypatch.setenv(env, "0")
    before = advise(True)
    try:
        suite.measure_all(case_ids=("bmm",), precisions=("float32", "float64"), devices=("cpu",), root=tmp_path)
        assert seen == [False, False] and advised() is True  # off while measuring, on again after
        thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
        if thp.exists() and "[madvise]" in thp.read_text():  # huge pages where asked for only ("always": anywhere)
            outside = np.ones(64 << 20, np.uint8)  # touched: its huge pages are in place
            with measure.memory.small_pages():
                inside = np.ones(64 << 20, np.uint8)
            assert _huge_kib(inside) == 0 and _huge_kib(outside) > 0
    finally:
        advise(before)


def test_fp32_route_names_what_mkl_itself_prints(cpu_suite):
    got, root = cpu_suite
    kid = got[Cell("square", "float32", "cpu")]["kernel_id"]
    entry = catalog.load(root, "kernels", kid)
    assert entry["device"] == "cpu"
    assert "aten::mm" in entry["full"]
    # Independently: MKL's own verbose output (switched on by its environment variable, in a
    # fresh process, not by torch's switch that kernels.py uses) for the same product.
    code = ("import torch; torch.manual_seed(0); a = torch.rand(512, 512); b = torch.rand(512, 512); a @ b")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MKL_VERBOSE": "1"})
    calls = [routes.normalise_mkl(line) for line in p.stdout.splitlines() if "GEMM(" in line]
    assert calls, p.stdout[-2000:]
    assert entry["full"][-1] == calls[-1]


def _mkl_lines(shape, dtype="float32"):
    """MKL's raw verbose lines for one torch product of ``shape``, in a fresh process."""
    m, k, n = shape
    code = f"import torch; a = torch.rand({m}, {k}, dtype=torch.{dtype}); b = torch.rand({k}, {n}, dtype=torch.{dtype}); a @ b"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "MKL_VERBOSE": "1"})
    return [line for line in p.stdout.splitlines() if "GEMM(" in line]


def test_kernel_id_changes_with_the_route_not_the_shape():
    shapes = [(64, 64, 64), (200, 300, 100)]
    raw = [_mkl_lines(s) for s in shapes]
    assert raw[0] and raw[1] and raw[0] != raw[1]  # MKL's own lines carry the sizes ...
    got = [measure.measure(cases.adhoc(*s), "float32", "cpu", timing=False) for s in shapes]
    # ... the kernel list keeps what MKL says of the route, and nothing of the shape
    for g, lines in zip(got, raw):
        assert g.kernels["full"][-1] == routes.normalise_mkl(lines[-1])
        assert not any(str(d) in name for name in g.kernels["full"] for d in (200, 300, 100))
    same_route = routes.normalise_mkl(raw[0][-1]) == routes.normalise_mkl(raw[1][-1])
    assert (got[0].kernel_id == got[1].kernel_id) == same_route
    # a different routine does change it
    dbl = measure.measure(cases.adhoc(64, 64, 64), "float64", "cpu", timing=False)
    assert "DGEMM" in dbl.kernels["full"][-1] and dbl.kernel_id != got[0].kernel_id


def _routed(monkeypatch, by_cols: dict[int, str]) -> measure.Measurement:
    """A measurement whose every traced call reports the route ``by_cols`` names for its output's
    column count (hand-built: which kernel ran is what the test says, not what this CPU picks)."""
    monkeypatch.setattr(kernels, "traced", lambda call, device: (y := call(), ["aten::mm", by_cols[y.shape[-1]]]))
    case = Case("routes", "mm", Shape(4, 8, 16), Shape(4, 8, 16), slice_n=(1, 2, 8))
    return measure.measure(case, "float32", "cpu", timing=False)


def test_kernel_id_tells_which_slice_took_which_route(monkeypatch):
    # Slices n = 1, 2, 8 by routes X, Y, Y and by X, X, Y: one kernel changed (n = 2 went from Y
    # to X), yet the merged list was [aten::mm, X, Y] both times, and so was the kernel-id.
    one = _routed(monkeypatch, {16: "F", 1: "X", 2: "Y", 8: "Y"})
    two = _routed(monkeypatch, {16: "F", 1: "X", 2: "X", 8: "Y"})
    assert one.kernels["slice_n"] == two.kernels["slice_n"] == ["aten::mm", "X", "Y"]
    assert one.kernel_id != two.kernel_id
    # Slices that all take one route are recorded as before: their kernel-ids do not change.
    same = _routed(monkeypatch, {16: "F", 1: "X", 2: "X", 8: "X"})
    assert same.kernels == {"full": ["aten::mm", "F"], "slice_n": ["aten::mm", "X"]}


def test_slice_m_drift_equals_a_direct_comparison():
    # A[:m] @ B differs from (A @ B)[:m] in fp32 for some
    # small m, which m depending on the CPU and MKL's settings. Find one here with plain torch.
    case = cases.get("batch-invariance-2")
    a_bits, b_bits, _ = measure.operand_bits(case, "float32", "cpu")
    a = torch.from_numpy(a_bits.view(np.float32))
    b = torch.from_numpy(b_bits.view(np.float32))
    c = a @ b
    drifting = [m for m in range(1, 17) if not torch.equal((a[:m] @ b), c[:m])]
    assert drifting, "no m in 1..16 drifts on this machine"
    m_ = drifting[0]
    got = measure.measure(case, "float32", "cpu", slice_m=(m_,), repeat=1, timing=False).slice_m[0]
    assert got["max_ulp"] > 0
    full = c[:m_].numpy().view(np.int32).astype(np.int64)
    part = (a[:m_] @ b).numpy().view(np.int32).astype(np.int64)
    # all outputs here are positive, so the ulp distance is the difference of the bit patterns
    assert got["max_ulp"] == int(np.abs(full - part).max())
    assert got["frac_differ"] == pytest.approx(np.count_nonzero(full != part) / full.size)


def test_error_u_against_independent_reference():
    case = cases.adhoc(32, 512, 48)
    m = measure.measure(case, "float16", "cpu", timing=False, with_kernels=False)
    a_bits, b_bits, _ = measure.operand_bits(case, "float16", "cpu")
    a = a_bits.view(np.float16).astype(np.float64)
    b = b_bits.view(np.float16).astype(np.float64)
    c = (torch.from_numpy(a_bits.view(np.float16)) @ torch.from_numpy(b_bits.view(np.float16))).double().numpy()
    exact = a @ b  # numpy's float64 product of the rounded inputs, independent of torch
    want = np.max(np.abs(c - exact) / (2.0**-11 * (np.abs(a) @ np.abs(b))))
    assert m.error_u == pytest.approx(want, rel=1e-9)
    assert m.error_u <= numerics.gamma_k_u(512, 2.0**-11)


def test_seed_case_shape_and_slices():
    c = cases.get("seed")
    assert (c.cpu.m, c.cpu.k, c.cpu.n) == (1, 4096, 51000)
    assert c.slice_n == (51000, 50000, 46000, 45999) and c.compare_cols == 45000
    assert measure.operand_shapes(c, "cpu") == ((4096,), (4096, 51000))


def test_normalised_names_from_fixture():
    lines = kernel_names.tagged()
    cpu = [routes.normalise_mkl(name) for tag, name in lines if tag == "cpu"]
    assert cpu[0] == cpu[1] == cpu[2] == "MKL SGEMM(N,N) CNR:OFF NThr:2"  # sizes, pointers, times gone
    assert cpu[3] == "MKL SGEMM(N,N) CNR:COMPATIBLE NThr:2"  # the CNR mode stays
    full = {routes.normalise_cuda(name) for tag, name in lines if tag != "cpu"}
    assert "splitKreduce_kernel<__half,__half,__half,__half>" in full  # args and spaces gone
    assert "nvjet_tst_320x128_64x3_2x1_v_badd_coopB_NNT" in full  # tile sizes are the route
    assert "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm" in full


def test_onednn_line_normalised():
    line = ("onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,"
            "src:bf16::blocked:ab::f0 wei:bf16::blocked:ab::f0 dst:bf16::blocked:ab::f0,attr-scratchpad:user,,64x256:256x128,0.156")
    assert routes.normalise_onednn(line) == "oneDNN matmul brg_matmul:avx10_1_512_amx src:bf16 wei:bf16 dst:bf16"
    assert routes.normalise_onednn("onednn_verbose,v1,info,cpu,runtime:OpenMP") is None


ONEDNN_NN = ("onednn_verbose,v1,primitive,exec,cpu,matmul,brg_matmul:avx10_1_512_amx,undef,src:bf16::blocked:ab::f0 "
             "wei:bf16::blocked:ab::f0 dst:bf16::blocked:ab::f0,attr-scratchpad:user,,256x1024:1024x1024,0.177002")


def test_onednn_names_keep_a_transposed_operand_and_drop_its_strides():
    """MKL's SGEMM(N,T) names a transposed B; oneDNN's verbose line says so in the layout tag
    (wei ``ba``), which was dropped, so A @ B and A @ Bᵀ-stored had one kernel-id while giving
    different bits (bfloat16 256×1024 @ 1024×1024 on an AMX Xeon, 0.25 apart). The leading
    dimension (``1024x1``, a slice's) is the shape's and goes; a plain row-major tag adds nothing,
    so the ids already recorded stay."""
    nt = ONEDNN_NN.replace("wei:bf16::blocked:ab::f0", "wei:bf16::blocked:ba::f0")
    strided = ONEDNN_NN.replace("wei:bf16::blocked:ab::f0", "wei:bf16::blocked:ab:1024x1:f0")
    batched = ONEDNN_NN.replace(":ab::", ":abc::")
    plain = "oneDNN matmul brg_matmul:avx10_1_512_amx src:bf16 wei:bf16 dst:bf16"
    assert routes.normalise_onednn(ONEDNN_NN) == routes.normalise_onednn(strided) == routes.normalise_onednn(batched) == plain
    assert routes.normalise_onednn(nt) == "oneDNN matmul brg_matmul:avx10_1_512_amx src:bf16 wei:bf16:ba dst:bf16"
    assert routes.normalise_onednn(nt.replace("src:bf16::blocked:ab::", "src:bf16::blocked:ba::")) == (
        "oneDNN matmul brg_matmul:avx10_1_512_amx src:bf16:ba wei:bf16:ba dst:bf16")
    # live: where this CPU sends a bfloat16 product to oneDNN, B stored transposed is named so
    a, b = torch.ones(8, 64, dtype=torch.bfloat16), torch.ones(64, 32, dtype=torch.bfloat16)
    lives = [kernels.route(lambda b=b: a @ b, "cpu")[-1] for b in (b, b.t().contiguous().t())]
    if all(r.startswith("oneDNN") for r in lives):
        assert lives[1] == lives[0].replace(" wei:bf16", " wei:bf16:ba"), lives


def test_onednn_names_keep_the_math_mode_of_an_fp32_product():
    """With torch.set_float32_matmul_precision("medium") a CPU fp32 product can go to oneDNN with
    its products in bfloat16 (``attr-fpmath:bf16``); that attribute was dropped, so the kernel
    list read as a plain fp32 oneDNN matmul (as aarch64 builds run fp32 by default). The
    scratchpad attribute says where scratch memory comes from and stays out."""
    fpmath = ONEDNN_NN.replace(":bf16:", ":f32:").replace("attr-scratchpad:user", "attr-scratchpad:user attr-fpmath:bf16")
    strict = ONEDNN_NN.replace(":bf16:", ":f32:")
    assert routes.normalise_onednn(strict) == "oneDNN matmul brg_matmul:avx10_1_512_amx src:f32 wei:f32 dst:f32"
    assert routes.normalise_onednn(fpmath) == routes.normalise_onednn(strict) + " attr-fpmath:bf16"
    a = torch.ones(16, 16)
    saved = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        got = kernels.route(lambda: a @ a, "cpu")[-1]
    finally:
        torch.set_float32_matmul_precision(saved)
    if got.startswith("oneDNN"):  # this CPU has a bfloat16 route for fp32 products
        assert got.endswith(" attr-fpmath:bf16"), got


def test_torch_version_check():
    selection.check_torch("2.13.0+cpu", {"ASV_ENV_NAME": "virtualenv-py3.11-numpy-torch2.13.0-wheel"})
    with pytest.raises(RuntimeError, match="names torch 2.14.1"):
        selection.check_torch("2.13.0+cpu", {"ASV_ENV_NAME": "virtualenv-py3.11-numpy-torch2.14.1-wheel"})
    with pytest.raises(RuntimeError):
        selection.check_torch("2.14.1", {"MATMUL_DRIFT_EXPECT_TORCH": "2.13.0"})
    selection.check_torch("2.14.1", {})  # an existing environment names nothing


def test_torch_version_check_reads_a_matrix_pinned_with_double_equals():
    """A matrix written ``"torch": ["==2.14.1"]`` gives asv's env name ``torch==2.14.1``: the
    check must still read the version, not skip silently."""
    from asv.environment import get_env_name

    name = get_env_name("virtualenv", "3.11", {"torch": "==2.14.1", "numpy": ""}, {})
    assert selection.expected_torch({"ASV_ENV_NAME": name}) == "2.14.1", name
    with pytest.raises(RuntimeError, match="names torch 2.14.1"):
        selection.check_torch("2.13.0+cpu", {"ASV_ENV_NAME": name})


def test_the_recorded_flags_name_every_matmul_mode_and_stay_put_across_precisions():
    """flags() records the matmul switches torch has (a torch that changes a default is then
    named in the attribution), and reads the same before, inside and after every other
    precision's block, from a fresh process on: the env-id must not depend on which combination
    was measured first. (fp32_precision, torch 2.9's spelling, reads "none" until a precision
    is first set, then "ieee".)"""
    code = """
from matmul_drift.core import cases
from matmul_drift.measure import environment, measure
first = environment.flags()
for key in ("allow_fp16_accumulation", "allow_fp16_reduced_precision_reduction_split_k",
            "allow_bf16_reduced_precision_reduction_split_k", "allow_bf16_reduced_precision_reduction"):
    assert isinstance(first[key], bool), key  # torch >= 2.7 has them all
for precision in cases.PRECISIONS:
    with measure.precision_flags(precision):
        inside = environment.flags()
    assert environment.flags() == first, (precision, environment.flags(), first)
    assert inside == first or precision in ("float32-tf32", "float32-high"), (precision, inside, first)
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.stdout == "ok\n", p.stderr[-2000:]


# ---------------------------------------------------------------------------- two slices compared


def test_two_outputs_compared_by_magnitude_band():
    """Exact truth in fp16: 1000.5 against 1000 is 0.5, one ulp in [512, 1024); 2000 against
    2001 is 1, one ulp in [1024, 2048); 3 and the equal 1000 do not differ."""
    x = np.array([1000.5, 1000.0, 2000.0, 3.0], dtype=np.float16)
    y = np.array([1000.0, 1000.0, 2001.0, 3.0], dtype=np.float16)
    got = numerics.by_magnitude(x.view(np.uint16), y.view(np.uint16), x.astype(np.float64), y.astype(np.float64),
                                "float16")
    assert got == {"entries": 4, "differ": 2, "nonfinite_differ": 0, "below": 1, "bands": [
        {"lo": 512.0, "hi": 1024.0, "ulp": 0.5, "differ": 1, "max_abs": 0.5, "max_ulp": 1},
        {"lo": 1024.0, "hi": 2048.0, "ulp": 1.0, "differ": 1, "max_abs": 1.0, "max_ulp": 1}]}
    inf = np.array([np.inf], dtype=np.float16)
    got = numerics.by_magnitude(inf.view(np.uint16), x[:1].view(np.uint16), inf.astype(np.float64),
                                x[:1].astype(np.float64), "float16")
    assert (got["differ"], got["nonfinite_differ"], got["bands"]) == (1, 1, [])


def test_the_seeds_two_slices_are_compared_with_each_other_as_torch_computes_them():
    """The seed's shape of question at a CPU's size: s (K,) @ v[:, :n] for two n sliced from one
    wider v, compared entry by entry; checked against torch's own products of the same
    operands, counted here with plain numpy."""
    case = Case("seed-like", "mv", Shape(1, 4096, 3000), Shape(1, 4096, 3000), layout="strided",
                slice_n=(2999, 2048), compare_cols=2000, pairs=((2999, 2048),), forms=("as-is",))
    m = measure.measure(case, "float16", "cpu", repeat=1, timing=False)
    p, full_a, full_b = m.slice_pairs  # the two slices, then each against the full product
    a_bits, b_bits, _ = measure.operand_bits(case, "float16", "cpu")
    a, b = measure.to_tensor(a_bits, "float16", "cpu"), measure.to_tensor(b_bits, "float16", "cpu")
    ya = (a @ b[:, :2999])[:2000].double().numpy()
    yb = (a @ b[:, :2048])[:2000].double().numpy()
    yf = (a @ b)[:2000].double().numpy()
    for got, x, y, ids in ((p, ya, yb, (2999, 2048)), (full_a, ya, yf, (2999, "full")), (full_b, yb, yf, (2048, "full"))):
        differ = x != y
        assert (got["a"], got["b"], got["cols"], got["entries"], got["differ"]) == (*ids, 2000, 2000, int(differ.sum()))
        mag = np.maximum(np.abs(x), np.abs(y))
        for band in got["bands"]:
            sel = differ & (mag >= band["lo"]) & (mag < band["hi"])
            assert band["differ"] == int(sel.sum()) and band["max_abs"] == float(np.abs(x - y)[sel].max())
            assert band["ulp"] == band["lo"] * 2.0**-10  # fp16 has 10 fraction bits
        assert sum(b["differ"] for b in got["bands"]) == got["differ"]


def test_the_pair_words_name_each_band_and_say_plainly_where_nothing_differs():
    """explain's words for the seed's comparisons, from by_magnitude's record of exact fp16
    values: the 0.5 shows in [512, 1024) with its ulp, and the entries below the lowest band
    are said to be alike; a slice against the full product is named so."""
    from matmul_drift.probes import explain

    x = np.array([1000.5, 2000.0, 3.0], dtype=np.float16)
    y = np.array([1000.0, 2001.0, 3.0], dtype=np.float16)
    rec = numerics.by_magnitude(x.view(np.uint16), y.view(np.uint16), x.astype(np.float64), y.astype(np.float64),
                                "float16")
    text = explain._pair_text({"a": 45999, "b": 46000, "form": "as-is", "cols": 3, **rec})
    assert text.startswith("[:, :45999] against [:, :46000] on the first 3 columns: 2 of 3 entries differ; by magnitude")
    rows = [line.split() for line in text.splitlines()[3:5]]
    assert rows == [["[512,", "1024)", "0.5", "1", "0.5", "1"], ["[1024,", "2048)", "1", "1", "1", "1"]], text
    assert text.endswith("No entry below 512 differs (1 entries there)."), text
    same = numerics.by_magnitude(x.view(np.uint16), x.view(np.uint16), x.astype(np.float64), x.astype(np.float64),
                                 "float16")
    text = explain._pair_text({"a": 46000, "b": "full", "form": "2d", "cols": 3, **same})
    assert text == "[:, :46000] against the full product (A 2-D) on the first 3 columns: 0 of 3 entries differ.", text
