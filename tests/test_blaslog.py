"""cuBLASLt's and cuBLAS's logs read into recipes and the handle's state (core/blaslog.py),
and the loggers set up through their C API (kernels.BlasLog), without a GPU.

The text is in the libraries' real formats; the values are made up, the layout is theirs:
- cuBLASLt's log: NVIDIA's cuBLAS documentation, "cuBLASLt Logging" (docs.nvidia.com/cuda/
  cublas, section 3.x; levels 1 Error, 2 Trace, 3 Hints, 4 Info, 5 Api), the Trace line's
  typed entry points (``cublasLtSSSMatmul``, cuBLAS 11 and 12; ``cublasLtTSTMatmul``, 13.x) and
  its algo fields (``numSplitsK=14 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE``) as
  CUBLASLT_LOG_LEVEL=5 prints them;
- cuBLAS's legacy log: the same documentation, "cuBLAS Logging" (CUBLAS_LOGINFO_DBG=1), one
  block per call with its ``i!Process=..; StreamId=..; MathMode=..`` line, and the set-up
  PyTorch makes before every product (aten/src/ATen/cuda/CublasHandlePool.cpp and CUDABlas.cpp:
  cublasSetStream, cublasSetWorkspace, cublasSetMathMode; cublasCreate/cublasDestroy around a
  handle), as cuBLAS 13.x prints them;
and a stand-in library in C that calls back as the real ones do."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from matmul_drift.core import blaslog, ids
from matmul_drift.measure import kernels

T = "[2026-12-05 04:57:13][cublasLt][8291]"  # cuBLAS 12 and 13 lines start with their time
LT = (f"{T}[Trace][cublasLtMatmul] A=0X7F8EB6002300 "
      "Adesc=[type=R_16F rows=4096 cols=1 ld=4096] B=0X7F8EB6001B00 Bdesc=[type=R_16F rows=4096 cols=46000 "
      "ld=51000] C=0X7F8EB6003200 Cdesc=[type=R_16F rows=1 cols=46000 ld=1] D=0X7F8EB6003200 Ddesc=[type=R_16F "
      "rows=1 cols=46000 ld=1] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] "
      "algo=[algoId=66 tile=MATMUL_TILE_512x8 stages=MATMUL_STAGES_64xAUTO numSplitsK=14 "
      "reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE customOption=3 clusterShape=CLUSTER_SHAPE_1x1x1] "
      "workSpace=0X7F0000000000 workSpaceSizeInBytes=33554432 beta=0 outOfPlace=0 stream=0X7EB04D0")
# cuBLAS 11: no time, the typed entry point, fields at their defaults left out
LT_11 = ("[cublasLt][3794797][Trace][cublasLtSSSMatmul] A=0X400380DD0A00 Adesc=[type=R_32F rows=1000 "
         "cols=1000 ld=1000] B=0X400380A00000 Bdesc=[type=R_32F rows=1000 cols=1000 ld=1000] C=0X4003811A1400 "
         "Cdesc=[type=R_32F rows=1000 cols=1000 ld=1000] D=0X4003811A1400 Ddesc=[type=R_32F rows=1000 cols=1000 "
         "ld=1000] computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F] algo=[algoId=21 "
         "tile=MATMUL_TILE_64x64 stages=MATMUL_STAGES_32x6] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 "
         "outOfPlace=0 stream=0X0")
# cuBLAS 12.x: the typed name, smCountTarget and an epilogue (its bias pointer a place)
LT_12 = (f"{T}[Trace][cublasLtHSHMatmul] A=0X7F1 Adesc=[type=R_16F rows=64 cols=64 ld=64] B=0X7F2 "
         "Bdesc=[type=R_16F rows=64 cols=64 ld=64] C=0X7F3 Cdesc=[type=R_16F rows=64 cols=64 ld=64] D=0X7F3 "
         "Ddesc=[type=R_16F rows=64 cols=64 ld=64] computeDesc=[computeType=COMPUTE_32F scaleType=R_32F "
         "smCountTarget=114 epilogue=EPILOGUE_BIAS biasPointer=0X7F4] algo=[algoId=31 tile=MATMUL_TILE_128x64 "
         "stages=MATMUL_STAGES_64x3 customOption=1] workSpace=0X7F5 workSpaceSizeInBytes=4194304 beta=1 "
         "outOfPlace=0 stream=0X0")
# cuBLAS 13.x: fp8 operands, A in row order, the typed name 13.x prints
LT_13 = (f"{T}[Trace][cublasLtTSTMatmul] A=0X7F1 Adesc=[type=R_8F_E4M3 rows=64 cols=128 ld=128 "
         "order=ORDER_ROW] B=0X7F2 Bdesc=[type=R_8F_E4M3 rows=128 cols=64 ld=128] C=0X7F3 Cdesc=[type=R_16BF "
         "rows=64 cols=64 ld=64] D=0X7F3 Ddesc=[type=R_16BF rows=64 cols=64 ld=64] computeDesc=[computeType="
         "COMPUTE_32F scaleType=R_32F aScalePointer=0X7F6 bScalePointer=0X7F7] algo=[algoId=66 "
         "tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_128xAUTO clusterShape=CLUSTER_SHAPE_2x1x1] "
         "workSpace=0X7F5 workSpaceSizeInBytes=33554432 beta=0 outOfPlace=0 stream=0X0")
# levels 1, 3, 4 and 5 beside the Trace line: the heuristic's Api lines, Hints, Info and an
# Error, none of them a call (the Api line of cublasLtMatmul itself neither)
LT_NOISE = "\n".join([
    f"{T}[Api][cublasLtMatmulAlgoGetHeuristic] Adesc=[type=R_16F rows=4096 cols=1 ld=4096] "
    "preference=[maxWavesCount=0.0 maxWorkspaceSizeinBytes=33554432] requestedAlgoCount=1",
    f"{T}[Hints][cublasLtMatmulAlgoGetHeuristic] Algo skipped: split-K too large",
    f"{T}[Info][cublasLtMatmulAlgoGetHeuristic] algo=[algoId=1 tile=MATMUL_TILE_64x64] status=OK",
    f"{T}[Error][cublasLtMatmulAlgoCheck] Failed to query algo: CUBLAS_STATUS_NOT_SUPPORTED",
    f"{T}[Api][cublasLtMatmul] A=0X7F8EB6002300 Adesc=0X55D1 B=0X7F8EB6001B00 Bdesc=0X55D2 algo=[algoId=66]",
])


def _block(version: str, signature: str, args: list[str], stream: str = "POINTER (IN HEX:0x0x0) (defaultStream)",
           mode: str = "CUBLAS_DEFAULT_MATH") -> str:
    """One call's block of cuBLAS's legacy log, as 13.x prints it."""
    return "\n".join([f"I! cuBLAS ({version}) function cublasStatus_t {signature} called:",
                      *(f"i!  {a}" for a in args),
                      "i! Time: 2026-12-05T04:57:13 elapsed from start 0.016667 minutes or 1.000000 seconds",
                      f"i!Process=10673; Thread=1239; GPU=0; Handle=POINTER (IN HEX:0x0x55d1c0); StreamId={stream}; "
                      f"MathMode={mode}"]) + "\n"


HANDLE = "handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x55d1c0)"
GEMMEX = _block("v13.0", "cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, "
                "const void*, const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*, "
                "void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t)", [
                    HANDLE, "transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)",
                    "transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)", "m: type=int; val=46000",
                    "n: type=int; val=1", "k: type=int; val=4096", "alpha: type=void; val=POINTER (IN HEX:0x0x7ffd16a0)",
                    "A: type=void; val=POINTER (IN HEX:0x0x7f0a00000000)", "Atype: type=cudaDataType_t; val=CUDA_R_16F(2)",
                    "lda: type=int; val=51000", "Btype: type=cudaDataType_t; val=CUDA_R_16F(2)",
                    "ldb: type=int; val=4096", "Ctype: type=cudaDataType_t; val=CUDA_R_16F(2)",
                    "ldc: type=int; val=46000", "computeType: type=cublasComputeType_t; val=CUBLAS_COMPUTE_32F(68)",
                    "algo: type=SOME TYPE; val=CUBLAS_GEMM_DEFAULT_TENSOR_OP(99)"],
                mode="CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION")
LEGACY = GEMMEX  # the product's block alone
SGEMM = _block("v13.4", "cublasSgemm_v2(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, "
               "const float*, const float*, int, const float*, int, const float*, float*, int)", [
                   HANDLE, "transa: type=cublasOperation_t; val=CUBLAS_OP_N(0)",
                   "transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)", "m: type=int; val=64", "n: type=int; val=64",
                   "k: type=int; val=64", "alpha: type=float; val=POINTER (IN HEX:0x0x7ffd16a0)",
                   "A: type=float; val=POINTER (IN HEX:0x0x7f0a00000000)", "lda: type=int; val=64",
                   "B: type=float; val=POINTER (IN HEX:0x0x7f0a00010000)", "ldb: type=int; val=64",
                   "beta: type=float; val=POINTER (IN HEX:0x0x7ffd16a4)",
                   "C: type=float; val=POINTER (IN HEX:0x0x7f0a00020000)", "ldc: type=int; val=64"])


def set_up(workspace: int = 33554432, create: bool = True) -> str:
    """What torch makes cuBLAS log before a product (CublasHandlePool.cpp): a handle made where
    none is cached, its stream, its workspace and its math mode, as cuBLAS 13.4 logs them."""
    made = _block("v13.4", "cublasCreate_v2(cublasContext**)",
                  ["handle: type=cublasHandle_t*; val=POINTER (IN HEX:0x0x7ffc5a1b2c30)"],
                  stream="POINTER (IN HEX:0x(nil))") + "i! COMPILED WITH: GNU GCC/G++ / 13.2.0\n"
    return (made if create else "") + "".join([
        _block("v13.4", "cublasSetStream_v2(cublasHandle_t, cudaStream_t)",
               [HANDLE, "streamId: type=SOME TYPE; val=POINTER (IN HEX:0x0x0)"]),
        _block("v13.4", "cublasSetWorkspace_v2(cublasHandle_t, void*, size_t)",
               [HANDLE, "workspace: type=void*; val=POINTER (IN HEX:0x0x7f0a02000000)",
                f"workspaceSizeInBytes: type=size_t; val={workspace}"]),
        _block("v13.4", "cublasSetMathMode(cublasHandle_t, cublasMath_t)",
               [HANDLE, "mode: type=cublasMath_t; val=CUBLAS_DEFAULT_MATH(0)"])])


DESTROY = _block("v13.4", "cublasDestroy_v2(cublasHandle_t)", [HANDLE])


def test_a_trace_line_gives_algorithm_tile_stages_split_k_and_reduction_not_the_workspace():
    (call,) = blaslog.lt_calls(LT + "\n" + LT_NOISE)  # Api, Hints, Info and Error lines are not calls
    assert call["function"] == "cublasLtMatmul"
    assert call["types"] == ["R_16F"] * 4
    assert call["compute"] == {"computeType": "COMPUTE_32F", "scaleType": "R_32F", "transa": "OP_T"}
    assert call["algo"] == {"algoId": "66", "tile": "MATMUL_TILE_512x8", "stages": "MATMUL_STAGES_64xAUTO",
                            "numSplitsK": "14", "reductionScheme": "REDUCTION_SCHEME_COMPUTE_TYPE",
                            "customOption": "3", "clusterShape": "CLUSTER_SHAPE_1x1x1"}
    assert call["workspace"] == 33554432
    assert call["sizes"]["B"] == {"rows": 4096, "cols": 46000, "ld": 51000}
    assert blaslog.lt_line(call) == (
        "cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F computeType=COMPUTE_32F scaleType=R_32F transa=OP_T "
        "algoId=66 tile=512x8 stages=64xAUTO numSplitsK=14 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE "
        "customOption=3 clusterShape=1x1x1")
    assert blaslog.handle_state(LT + "\n" + LT_NOISE, "")["lt_workspace_bytes"] == [33554432]


def test_lines_of_cublas_11_12_and_13_read_alike_with_their_typed_names_as_one():
    (old,) = blaslog.lt_calls(LT_11)
    assert blaslog.lt_line(old) == ("cuBLASLt cublasLtMatmul R_32F,R_32F,R_32F,R_32F "
                                    "computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F algoId=21 tile=64x64 "
                                    "stages=32x6")
    (twelve,) = blaslog.lt_calls(LT_12)
    assert blaslog.lt_line(twelve) == (
        "cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F computeType=COMPUTE_32F scaleType=R_32F "
        "smCountTarget=114 epilogue=EPILOGUE_BIAS algoId=31 tile=128x64 stages=64x3 customOption=1")
    (fp8,) = blaslog.lt_calls(LT_13)
    assert fp8["types"] == ["R_8F_E4M3[order=ORDER_ROW]", "R_8F_E4M3", "R_16BF", "R_16BF"]
    assert "clusterShape=2x1x1" in blaslog.lt_line(fp8) and "ScalePointer" not in blaslog.lt_line(fp8)
    # the same call under cuBLAS 12's and 13's entry point names, with and without the time: one recipe
    sss, tst = LT_11, LT_11.replace("[cublasLt][3794797]", T).replace("cublasLtSSSMatmul", "cublasLtTSTMatmul")
    assert blaslog.recipe_lines(sss, "") == blaslog.recipe_lines(tst, "")
    assert ids.object_id({"full": ["k"] + blaslog.recipe_lines(sss, "")}) == \
        ids.object_id({"full": ["k"] + blaslog.recipe_lines(tst, "")})
    # every level from 2 (Trace) to 5 (Api): the Trace lines alone are calls
    assert len(blaslog.lt_calls("\n".join([LT_NOISE, LT_11, LT_NOISE, LT_12, LT_13]))) == 3


def test_the_legacy_block_gives_the_call_its_arguments_less_sizes_pointers_and_math_mode():
    (call,) = blaslog.legacy_calls(LEGACY)
    assert call["function"] == "cublasGemmEx"
    assert call["args"]["lda"] == "51000" and call["args"]["m"] == "46000"  # kept in the call, for the reader
    assert "handle" not in call["args"] and "A" not in call["args"] and "alpha" not in call["args"]
    assert call["math_mode"] == "CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION"
    assert call["stream"] == "default"
    assert blaslog.legacy_line(call) == (
        "cuBLAS cublasGemmEx(transa=CUBLAS_OP_T, transb=CUBLAS_OP_N, Atype=CUDA_R_16F, Btype=CUDA_R_16F, "
        "Ctype=CUDA_R_16F, computeType=CUBLAS_COMPUTE_32F, algo=CUBLAS_GEMM_DEFAULT_TENSOR_OP)")


def test_the_handles_set_up_is_its_state_not_the_recipe():
    """A GemmEx and an Sgemm among the blocks torch's set-up makes cuBLAS 13.x log: each product
    is one recipe line, the same with and without the set-up, and the workspace, math mode and
    stream are the handle's state; whether the handle was made in this call is recorded nowhere."""
    for product in (GEMMEX, SGEMM):
        bare = blaslog.recipe_lines("", product)
        logged = set_up() + product + DESTROY
        assert len(bare) == 1 and blaslog.recipe_lines("", logged) == bare
        assert blaslog.recipe_lines("", set_up(workspace=0, create=False) + product) == bare
        assert ids.object_id({"full": ["k"] + bare}) == \
            ids.object_id({"full": ["k"] + blaslog.recipe_lines("", logged)})
    assert blaslog.recipe_lines("", SGEMM) == ["cuBLAS cublasSgemm_v2(transa=CUBLAS_OP_N, transb=CUBLAS_OP_N)"]
    state = blaslog.handle_state(LT, set_up() + GEMMEX + DESTROY)
    assert state == {"workspace_bytes": [33554432], "lt_workspace_bytes": [33554432],
                     "math_modes": ["CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION"],
                     "streams": ["default"], "unread_lines": 0, "unread": []}
    assert blaslog.handle_state(LT, set_up(create=False) + GEMMEX) == state
    other = blaslog.handle_state("", set_up(workspace=0) + _block("v13.4", "cublasSgemm_v2(..)", [HANDLE],
                                                                  stream="POINTER (IN HEX:0x0x7f01)"))
    assert other["workspace_bytes"] == [0] and other["streams"] == ["other"]
    assert blaslog.merge_states([state, other])["workspace_bytes"] == [0, 33554432]
    assert blaslog.merge_states([]) is None


def test_a_recipe_change_under_the_same_kernel_name_changes_the_kernel_id():
    name = "nvjet_sm90_hsh_512x8_64x16_2x1_v_bz_splitK_TNT"
    split = blaslog.recipe_lines(LT, "")
    whole = blaslog.recipe_lines(LT.replace("numSplitsK=14 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE ", ""), "")
    assert split != whole
    assert ids.object_id({"full": [name] + split}) != ids.object_id({"full": [name] + whole})
    assert blaslog.recipe_lines(LT.replace("algoId=66", "algoId=67"), "") != split
    # sizes, places and the workspace are not the recipe: another shape, other pointers, another workspace
    moved = LT.replace("cols=46000", "cols=45999").replace("0X7F8EB6002300", "0X1")
    assert blaslog.recipe_lines(moved.replace("InBytes=33554432", "InBytes=0"), "") == split


def test_no_log_is_no_recipe_and_a_line_not_read_is_kept_and_counted():
    assert blaslog.recipe_lines("", "") == []
    cut = "[cublasLt][1][Trace][cublasLtMatmul] algo=["
    odd = "[cublasLt] something new"
    stray = "i!  m: type=int; val=3"  # an argument before any call
    lines, state = blaslog.read_logs(f"{cut}\n{odd}\n{LT}", f"{stray}\n{GEMMEX}W! cuBLAS a warning\n")
    assert len(lines) == 2  # the calls that were whole are read all the same
    assert state["unread_lines"] == 4 and state["unread"] == [cut, odd, stray, "W! cuBLAS a warning"]
    many = "\n".join(f"[cublasLt] line {i}" for i in range(50))
    state = blaslog.handle_state(many, "")
    assert state["unread_lines"] == 50 and len(state["unread"]) == blaslog.UNREAD_KEPT


FAKE = r"""
typedef void (*lt_cb)(int, const char *, const char *);
typedef void (*blas_cb)(const char *);
static lt_cb lt; static blas_cb blas; static int level, on;
int cublasLtLoggerSetCallback(lt_cb cb) { lt = cb; return 0; }
int cublasLtLoggerSetLevel(int l) { level = l; return 0; }
int cublasSetLoggerCallback(blas_cb cb) { blas = cb; return 0; }
int cublasLoggerConfigure(int is_on, int out, int err, const char *file) { on = is_on; return 0; }
/* a product: the log as each library writes it where its logging is on */
void product(const char *legacy, const char *message) {
  if (on && blas) blas(legacy);
  if (level >= 2 && lt) lt(2, "cublasLtMatmul", message);
  if (level >= 5 && lt) lt(5, "cublasLtMatmulDescCreate", "computeType=COMPUTE_32F");
}
"""


@pytest.fixture(scope="module")
def fake_library(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler")
    d = tmp_path_factory.mktemp("fakeblas")
    (d / "fake.c").write_text(FAKE)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(d / "libfakeblas.so"), str(d / "fake.c")], check=True)
    return ctypes.CDLL(str(d / "libfakeblas.so"))


def test_the_loggers_report_only_the_call_inside_logging_and_the_recipes_come_through_c(fake_library):
    log = kernels.BlasLog({"lt": fake_library, "blas": fake_library})
    assert log.notes == []
    message = LT.split("[cublasLtMatmul] ", 1)[1].encode()
    fake_library.product(LEGACY.encode(), message)  # logging off: a timed call logs nothing
    assert log.recipes() == []
    with log.logging():
        fake_library.product(LEGACY.encode(), message)
    assert log.recipes() == blaslog.recipe_lines(LT, LEGACY)
    assert len(log.recipes()) == 2
    assert log.handle_state()["lt_workspace_bytes"] == [33554432] and log.handle_state() is None
    fake_library.product(LEGACY.encode(), message)  # off again after the block
    with log.logging():
        pass
    assert log.recipes() == []


def test_a_library_without_the_logger_api_is_a_note_and_no_recipe(fake_library):
    libc = ctypes.CDLL(None)
    log = kernels.BlasLog({"lt": libc, "blas": None})
    assert log.notes and "cublasLtLoggerSetCallback" in log.notes[0]
    with log.logging():
        fake_library.product(LEGACY.encode(), b"")
    assert log.recipes() == []
    # a library that prints its log to stdout rather than to the callback is read there
    assert log.recipes(LT) == blaslog.recipe_lines(LT, LT)[-1:]


def test_loaded_library_reads_the_maps_file(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 12 /usr/lib/libc.so.6\n"
                    "7f02-7f03 r-xp 00000000 08:01 13 /opt/nvidia/cublas/lib/libcublasLt.so.13\n"
                    "7f04-7f05 rw-p 00000000 00:00 0 \n")
    assert kernels.loaded_library("libcublasLt.so", str(maps)) == "/opt/nvidia/cublas/lib/libcublasLt.so.13"
    assert kernels.loaded_library("libcublas.so", str(maps)) is None
    assert kernels.loaded_library("x", str(tmp_path / "absent")) is None


def test_stdout_lines_of_the_libraries_are_taken_out_of_the_output():
    logged, rest = kernels._cublas_lines(LT + "\nhello\n" + LEGACY)
    assert rest == "hello\n"
    assert blaslog.recipe_lines(logged, logged) == blaslog.recipe_lines(LT, LEGACY)
