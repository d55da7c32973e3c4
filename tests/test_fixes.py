"""The fix finder's candidate table (fixes.py): what it holds, where each applies, and that
each CPU candidate's settings reach a fresh process. No GPU needed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from matmul_drift.probes import fixes

ALL = set(fixes.DRIFTS)


def names(device, drifts=ALL, along="n", isa="AVX512_CORE_AMX", precision=None) -> dict[str, str | None]:
    return {c.name: why for c, why in fixes.candidates(device, drifts, along, isa, precision)}


def test_the_table_holds_every_candidate_the_issue_names():
    cpu, cuda = names("cpu"), names("cuda")
    for n in ("one thread", "MKL_CBWR=COMPATIBLE", "MKL_CBWR=AVX2", "MKL_CBWR=AUTO", "ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16",
              "contiguous copy of the slice", "full product, then slice",
              *(f"pad n to a multiple of {k}" for k in (4, 8, 16, 32))):
        assert cpu[n] is None, n
    for n in ("TF32 off", "split-K off, cuBLASLt", "reduced-precision reduction off, cuBLASLt", "cuBLAS workspace :16:8, cuBLASLt workspace 1",
              "deterministic algorithms", "pad n to a multiple of 8"):
        assert cuda[n] is None, n
    assert "batch_invariant_ops kernels" in cuda
    assert len({c.name for c in fixes.CANDIDATES}) == len(fixes.CANDIDATES)


def test_applicability_names_its_reason():
    cpu, cuda = names("cpu"), names("cuda")
    assert "CUDA setting" in cpu["TF32 off"] and "CPU setting" in cuda["one thread"]
    only_run_to_run = names("cpu", {"run_to_run"})
    assert "targets slice_n" in only_run_to_run["contiguous copy of the slice"]
    assert only_run_to_run["one thread"] is None
    if __import__("importlib").util.find_spec("batch_invariant_ops") is None:
        assert cuda["batch_invariant_ops kernels"] == "batch_invariant_ops is not installed"
    assert names("cpu", along="m")["pad m to a multiple of 4"] is None
    assert names("cpu", isa="SSE41")["ONEDNN_MAX_CPU_ISA=None"].startswith("no ISA below")


def test_tf32_off_is_offered_where_tf32_runs_and_survives_the_precisions_flags():
    for p in ("float32-tf32", "float32-high"):
        assert names("cuda", precision=p)["TF32 off"] is None
    for p in ("float32", "float16", "bfloat16", "float64"):
        assert names("cuda", precision=p)["TF32 off"] == f"changes float32-tf32 and float32-high only; this case is {p}"
    assert names("cuda", precision="float16")["deterministic algorithms"] is None
    # The measurement sets its precision's flags after a candidate's setup (measure.precision_flags),
    # so a setup that set them would be undone: a candidate reaches them through the environment.
    owned = re.compile(r"allow_tf32|set_float32_matmul_precision|fp32_precision")
    assert not [c.name for c in fixes.CANDIDATES if owned.search(c.setup)]
    assert next(c for c in fixes.CANDIDATES if c.name == "TF32 off").env == {"NVIDIA_TF32_OVERRIDE": "0"}


def test_code_changes_are_marked_and_settings_are_not():
    by_name = {c.name: c for c, _ in fixes.candidates("cpu", ALL, "k", "AVX2")}
    assert by_name["full product, then slice"].changes_code and by_name["pad k to a multiple of 16"].changes_code
    assert all("\n" not in c.code for c in by_name.values() if c.code)  # one line each
    assert not by_name["one thread"].changes_code and not by_name["MKL_CBWR=AVX2"].changes_code
    assert fixes.isa_step_down("AVX2") == "AVX" and fixes.isa_step_down("SSE41") is None


@pytest.mark.parametrize("c", [c for c in fixes.CANDIDATES if c.device == "cpu" and not c.env.get("ONEDNN_MAX_CPU_ISA") == ""],
                         ids=lambda c: c.name)
def test_each_cpu_setting_reaches_its_fresh_process(c):
    # The candidate's environment and prelude, in a process of their own, as the finder runs them.
    probe = fixes.prelude(c) + (
        "import json, os\n"
        "print(json.dumps({'threads': torch.get_num_threads(), "
        "'env': {k: os.environ.get(k) for k in ('MKL_CBWR', 'OMP_NUM_THREADS')}}))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    p = subprocess.run([sys.executable, "-c", probe], env={**env, **c.env}, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.strip().splitlines()[-1])
    for k, v in c.env.items():
        if k in got["env"]:
            assert got["env"][k] == v
    if c.name == "one thread":
        assert got["threads"] == 1


def test_cuda_preludes_compile_and_name_real_torch_settings():
    import torch

    for c in fixes.CANDIDATES:
        if c.device == "cuda":
            compile(fixes.prelude(c), c.name, "exec")
    # the settings they assign exist on this torch, GPU or not
    assert hasattr(torch.backends.cuda.matmul, "allow_fp16_reduced_precision_reduction")
    assert hasattr(torch.backends.cuda.matmul, "allow_bf16_reduced_precision_reduction")
    assert callable(torch.backends.cuda.preferred_blas_library) and callable(torch.use_deterministic_algorithms)


def test_the_split_k_candidate_turns_split_k_off_on_this_torch():
    """Its setup run here, all but the BLAS choice (a CPU build refuses cuBLASLt): both
    precisions read back with reduced precision and split-K off, where both were on."""
    import torch

    [c] = [c for c in fixes.CANDIDATES if c.name == "split-K off, cuBLASLt"]
    m = torch.backends.cuda.matmul
    before = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    try:
        m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = (True, True)
        exec(fixes.prelude(c).replace("torch.backends.cuda.preferred_blas_library('cublaslt')", ""), {})
        assert [m.allow_fp16_reduced_precision_reduction, m.allow_fp16_reduced_precision_reduction_split_k,
                m.allow_bf16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction_split_k] == [False] * 4
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = before


@pytest.mark.parametrize("flags,isa,down", [
    ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"},
     "AVX512_CORE_AMX", "AVX512_CORE_FP16"),  # this project's Intel Xeon
    ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"}, "AVX512_CORE_BF16", "AVX512_CORE_VNNI"),
    ({"avx", "avx2"}, "AVX2", "AVX"),
    (set(), "SSE41", None),
])
def test_onednn_isa_and_its_step_down(flags, isa, down):
    assert fixes.onednn_isa(flags) == isa and fixes.isa_step_down(isa) == down


AMX = {"avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16"}


@pytest.mark.parametrize("cap,isa", [
    ("AVX2", "AVX2"), ("avx2", "AVX2"), ("AVX10_1_512", "AVX512_CORE_FP16"), ("AVX512_CORE_BF16", "AVX512_CORE_BF16"),
    ("AVX512_CORE_AMX_FP16", "AVX512_CORE_AMX"),  # above the CPU: oneDNN runs what the CPU has
    ("ALL", "AVX512_CORE_AMX"), ("", "AVX512_CORE_AMX"), (None, "AVX512_CORE_AMX"), ("bogus", "AVX512_CORE_AMX"),
])
def test_the_step_down_starts_from_a_cap_already_in_force(cap, isa):
    # Under ONEDNN_MAX_CPU_ISA=AVX2 the step down from the CPU's AVX512_CORE_AMX (to AVX512_CORE_FP16)
    # would raise oneDNN's ISA above what it runs: a step up, offered as a step down.
    assert fixes.onednn_isa(AMX, cap) == isa


@pytest.mark.parametrize("env,isa", [
    ({"DNNL_MAX_CPU_ISA": "AVX2"}, "AVX2"),  # oneDNN's older name caps as well
    ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE", "DNNL_MAX_CPU_ISA": "AVX2"}, "AVX512_CORE"),  # the newer name wins
    ({"ONEDNN_MAX_CPU_ISA": "", "DNNL_MAX_CPU_ISA": "AVX2"}, "AVX2"),  # an empty one is not set
])
def test_the_cap_in_force_reads_both_of_onednns_names(monkeypatch, env, isa):
    # Under DNNL_MAX_CPU_ISA=AVX2 alone the old code started from the CPU's AVX512_CORE_AMX and offered
    # ONEDNN_MAX_CPU_ISA=AVX512_CORE_FP16, which overrides the DNNL cap: a step up, offered as a step down.
    from matmul_drift.store import machine

    monkeypatch.setattr(machine, "fingerprint", lambda: {"isa": sorted(AMX)})
    for name in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert fixes.onednn_isa_in_force() == isa


def test_explain_takes_the_step_down_from_its_own_onednn_cap(monkeypatch, capsys):
    from matmul_drift.cli import main as cli
    from matmul_drift.probes import fixfind
    from matmul_drift.store import machine

    seen = []
    monkeypatch.setattr(machine, "fingerprint", lambda: {"isa": sorted(AMX)})
    monkeypatch.setattr(fixfind, "try_fixes_many", lambda specs, isa, **kw: seen.append(isa) or [
        {"baseline": {"drift": {}}, "drifts": [], "candidates": [], "cheapest": None}])
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert cli.main(["explain", "--m", "2", "--k", "16", "--n", "8", "--dtype", "float32", "--try-fixes", "--json"]) == 0
    json.loads(capsys.readouterr().out)
    assert seen == ["AVX2"]
    assert [c.name for c, why in fixes.candidates("cpu", ALL, "n", seen[0]) if "ONEDNN_MAX_CPU_ISA" in c.env] == \
        ["ONEDNN_MAX_CPU_ISA=AVX"]


def test_the_batch_invariant_ops_candidate_turns_its_kernels_on(monkeypatch):
    # batch_invariant_ops (thinking-machines-lab) swaps in its kernels at
    # enable_batch_invariant_mode(); its set_batch_invariant_mode is a context manager, which a
    # bare call makes and drops unentered. A stand-in with that API, as the candidate's process
    # would import it.
    import contextlib
    import types

    state = {"on": False}

    def enable():
        state["on"] = True

    def disable():
        state["on"] = False

    @contextlib.contextmanager
    def set_batch_invariant_mode(enabled=True):
        old = state["on"]
        (enable if enabled else disable)()
        yield
        state["on"] = old

    stub = types.ModuleType("batch_invariant_ops")
    stub.enable_batch_invariant_mode, stub.disable_batch_invariant_mode = enable, disable
    stub.set_batch_invariant_mode = set_batch_invariant_mode
    monkeypatch.setitem(sys.modules, "batch_invariant_ops", stub)
    (c,) = [c for c in fixes.CANDIDATES if c.needs == "batch_invariant_ops"]
    exec(fixes.prelude(c), {})
    assert state["on"]
