"""cuBLASLt's and cuBLAS's logs read into recipes (core/blaslog.py), and the loggers set up
through their C API (kernels.BlasLog), without a GPU: text in the documented formats (cuBLAS
docs, "cuBLASLt Logging" and "cuBLAS Logging"; the values here are made up, the layout is the
libraries'), and a stand-in library in C that calls back as the real ones do."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import pytest

from matmul_drift.core import blaslog, ids
from matmul_drift.measure import kernels

LT = ("[2026-12-05 04:57:13][cublasLt][8291][Trace][cublasLtMatmul] A=0X7F8EB6002300 "
      "Adesc=[type=R_16F rows=4096 cols=1 ld=4096] B=0X7F8EB6001B00 Bdesc=[type=R_16F rows=4096 cols=46000 ld=51000] "
      "C=0X7F8EB6003200 Cdesc=[type=R_16F rows=1 cols=46000 ld=1] D=0X7F8EB6003200 Ddesc=[type=R_16F rows=1 cols=46000 ld=1] "
      "computeDesc=[computeType=COMPUTE_32F scaleType=R_32F transa=OP_T] "
      "algo=[algoId=66 tile=MATMUL_TILE_512x8 stages=MATMUL_STAGES_64xAUTO numSplitsK=4 reductionScheme=OUTPUT_TYPE "
      "customOption=3 clusterShape=CLUSTER_SHAPE_1x1x1] workSpace=0X7F0000000000 workSpaceSizeInBytes=33554432 "
      "beta=0 outOfPlace=0 stream=0X7EB04D0")
# an older layout: no time, a typed function name, fields at their defaults left out
LT_OLD = ("[cublasLt][3794797][Trace][cublasLtSSSMatmul] A=0X400380DD0A00 Adesc=[type=R_32F rows=1000 cols=1000 "
          "ld=1000] B=0X400380A00000 Bdesc=[type=R_32F rows=1000 cols=1000 ld=1000] C=0X4003811A1400 Cdesc=[type=R_32F "
          "rows=1000 cols=1000 ld=1000] D=0X4003811A1400 Ddesc=[type=R_32F rows=1000 cols=1000 ld=1000] "
          "computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F] algo=[algoId=21 tile=MATMUL_TILE_64x64 "
          "stages=MATMUL_STAGES_32x6] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
LT_NOISE = ("[2026-12-05 04:57:13][cublasLt][8291][Api][cublasLtMatmulAlgoGetHeuristic] Adesc=[type=R_16F rows=4096 "
            "cols=1 ld=4096] preference=[maxWavesCount=0.0 maxWorkspaceSizeinBytes=33554432]\n"
            "[2026-12-05 04:57:13][cublasLt][8291][Info][cublasLtMatmulAlgoGetHeuristic] algo=[algoId=1]")
LEGACY = """I! cuBLAS (v13.0) function cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*, cudaDataType_t, int, const void*, cudaDataType_t, int, const void*, void*, cudaDataType_t, int, cublasComputeType_t, cublasGemmAlgo_t) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x55d1c0)
i!  transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)
i!  transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)
i!  m: type=int; val=46000
i!  n: type=int; val=1
i!  k: type=int; val=4096
i!  alpha: type=void; val=POINTER (IN HEX:0x0x7ffd16a0)
i!  A: type=void; val=POINTER (IN HEX:0x0x7f0a00000000)
i!  Atype: type=cudaDataType_t; val=CUDA_R_16F(2)
i!  lda: type=int; val=51000
i!  Btype: type=cudaDataType_t; val=CUDA_R_16F(2)
i!  ldb: type=int; val=4096
i!  Ctype: type=cudaDataType_t; val=CUDA_R_16F(2)
i!  ldc: type=int; val=46000
i!  computeType: type=cublasComputeType_t; val=CUBLAS_COMPUTE_32F(68)
i!  algo: type=SOME TYPE; val=CUBLAS_GEMM_DEFAULT_TENSOR_OP(99)
i! Time: 2026-12-05T04:57:13 elapsed from start 0.016667 minutes or 1.000000 seconds
i!Process=10673; Thread=1239; GPU=0; Handle=POINTER (IN HEX:0x0x55d1c0); StreamId=POINTER (IN HEX:0x0x0) (defaultStream); MathMode=CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
"""


def test_a_trace_line_gives_algorithm_tile_stages_split_k_reduction_and_workspace():
    (call,) = blaslog.lt_calls(LT + "\n" + LT_NOISE)  # API and Info lines are not calls
    assert call["function"] == "cublasLtMatmul"
    assert call["types"] == ["R_16F"] * 4
    assert call["compute"] == {"computeType": "COMPUTE_32F", "scaleType": "R_32F", "transa": "OP_T"}
    assert call["algo"] == {"algoId": "66", "tile": "MATMUL_TILE_512x8", "stages": "MATMUL_STAGES_64xAUTO",
                            "numSplitsK": "4", "reductionScheme": "OUTPUT_TYPE", "customOption": "3",
                            "clusterShape": "CLUSTER_SHAPE_1x1x1"}
    assert call["workspace"] == 33554432
    assert call["sizes"]["B"] == {"rows": 4096, "cols": 46000, "ld": 51000}
    assert blaslog.lt_line(call) == (
        "cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F computeType=COMPUTE_32F scaleType=R_32F transa=OP_T "
        "algoId=66 tile=512x8 stages=64xAUTO numSplitsK=4 reductionScheme=OUTPUT_TYPE customOption=3 "
        "clusterShape=1x1x1 workspace=33554432")


def test_an_older_line_without_time_reads_alike_and_defaults_stay_out():
    (call,) = blaslog.lt_calls(LT_OLD)
    assert blaslog.lt_line(call) == ("cuBLASLt cublasLtSSSMatmul R_32F,R_32F,R_32F,R_32F "
                                     "computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F algoId=21 tile=64x64 "
                                     "stages=32x6 workspace=0")


def test_the_legacy_block_gives_the_call_its_arguments_and_math_mode_less_sizes_and_pointers():
    (call,) = blaslog.legacy_calls(LEGACY)
    assert call["function"] == "cublasGemmEx"
    assert call["args"]["lda"] == "51000" and call["args"]["m"] == "46000"  # kept in the call, for the reader
    assert "handle" not in call["args"] and "A" not in call["args"] and "alpha" not in call["args"]
    assert call["math_mode"] == "CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION"
    assert blaslog.legacy_line(call) == (
        "cuBLAS cublasGemmEx(transa=CUBLAS_OP_T, transb=CUBLAS_OP_N, Atype=CUDA_R_16F, Btype=CUDA_R_16F, "
        "Ctype=CUDA_R_16F, computeType=CUBLAS_COMPUTE_32F, algo=CUBLAS_GEMM_DEFAULT_TENSOR_OP) "
        "MathMode=CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION")


def test_a_recipe_change_under_the_same_kernel_name_changes_the_kernel_id():
    name = "nvjet_sm90_hsh_512x8_64x16_2x1_v_bz_splitK_TNT"
    split = blaslog.recipe_lines(LT, "")
    whole = blaslog.recipe_lines(LT.replace("numSplitsK=4 reductionScheme=OUTPUT_TYPE ", ""), "")
    assert split != whole
    assert ids.object_id({"full": [name] + split}) != ids.object_id({"full": [name] + whole})
    # sizes and places are not the recipe: another shape and other pointers give the same line
    moved = LT.replace("cols=46000", "cols=45999").replace("0X7F8EB6002300", "0X1")
    assert blaslog.recipe_lines(moved, "") == split


def test_no_log_is_no_recipe_and_garbage_is_ignored():
    assert blaslog.recipe_lines("", "") == []
    assert blaslog.recipe_lines("[cublasLt][1][Trace][cublasLtMatmul] algo=[", "i!  m: type=int; val=3\n") == []


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
