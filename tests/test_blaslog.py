"""cuBLASLt's and cuBLAS's logs read into recipes and the handle's state (core/blaslog.py),
and the loggers set up through their C API (kernels.BlasLog), without a GPU.

The log text is real: lines copied from public captures, or assembled from a capture's own
fields where no capture shows the whole line; each constant names its source. The formats are
those of NVIDIA's cuBLAS documentation, "cuBLASLt Logging" (CUBLASLT_LOG_LEVEL: 1 Error,
2 Trace, 3 Hints, 4 Info, 5 Api) and "cuBLAS Logging" (CUBLAS_LOGINFO_DBG=1), and a stand-in
library in C calls back as the real ones do. Searched for and not found (the index's
find_string, search over GitHub issues, code and pages): a Hints or an Info line of cuBLASLt,
and any cuBLAS 12.x or 13.x capture of cublasSetStream, cublasSetWorkspace, cublasSetMathMode
or cublasGemmEx blocks; those are the 11.x captures' lines in 13.4.1's block layout. 12.x's
legacy log is seen in one Sgemm block (SGEMM_12), 13.x's in a whole Sgemm log."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess

import pytest

from matmul_drift.core import blaslog, ids
from matmul_drift.measure import kernels

# cuBLASLt's time prefix, as CUBLASLT_LOG_LEVEL=4 printed it in an XLA fp8 repro of 2023-04-07
# (public file; find_string "[Trace][cublasLtMatmul]" finds it; the index names no repository)
T = "[2023-04-07 04:57:13][cublasLt][8291]"
# No time prefix, the typed entry point, smCountTarget: torch.matmul of two 1000x1000 fp32
# tensors (TF32) under CUBLASLT_LOG_LEVEL=5, verbatim (public file; find_string
# "[Trace][cublasLtSSSMatmul]"; no repository or cuBLAS version named; 108 SMs: an A100)
LT_11 = ("[cublasLt][3794797][Trace][cublasLtSSSMatmul] A=0X400380DD0A00 Adesc=[type=R_32F "
         "rows=1000 cols=1000 ld=1000] B=0X400380A00000 Bdesc=[type=R_32F rows=1000 cols=1000 "
         "ld=1000] C=0X4003811A1400 Cdesc=[type=R_32F rows=1000 cols=1000 ld=1000] "
         "D=0X4003811A1400 Ddesc=[type=R_32F rows=1000 cols=1000 ld=1000] "
         "computeDesc=[computeType=COMPUTE_32F_FAST_TF32 scaleType=R_32F smCountTarget=108] "
         "algo=[algoId=21 tile=MATMUL_TILE_128x128 stages=MATMUL_STAGES_32x5] workSpace=0X0 "
         "workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
# Split-K with its reduction scheme, as a check of a logged fp32 torch linear asserts its
# tokens (public file; find_string "reductionScheme=REDUCTION_SCHEME"; no repository named):
# the descriptors, computeDesc, algo and tail are those tokens verbatim, in the field order of
# the lines above; the pointers and the time prefix are made up.
LT_SPLIT_K = (f"{T}[Trace][cublasLtSSSMatmul] A=0X7F0A00000000 Adesc=[type=R_32F rows=2304 "
              "cols=768 ld=2304] B=0X7F0A00700000 Bdesc=[type=R_32F rows=2304 cols=144 ld=2304] "
              "C=0X7F0A00900000 Cdesc=[type=R_32F rows=768 cols=144 ld=768] D=0X7F0A00900000 "
              "Ddesc=[type=R_32F rows=768 cols=144 ld=768] computeDesc=[computeType=COMPUTE_32F "
              "scaleType=R_32F transa=OP_T smCountTarget=128] algo=[algoId=0 "
              "tile=MATMUL_TILE_128x64 reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE "
              "numSplitsK=14] workSpace=0X7F0A02000000 workSpaceSizeInBytes=6193152 beta=0 "
              "outOfPlace=0 stream=0X0")
# The seed's product on an H200 as a Hopper fp16 line: the algo field verbatim from a report
# of cuBLAS 13.1.1.3 on an H200 under CUBLASLT_LOG_LEVEL=5 (public file; find_string
# "clusterShape=CLUSTER_SHAPE_2x2x1"; no repository named; it also lists the typed names
# cublasLt{SSS,HSH,HHH,HSS,BSS,...}Matmul that libcublas calls for cublasGemmEx); the
# rest in the field order of the lines above, 32 MiB the workspace torch gives sm90.
LT = (f"{T}[Trace][cublasLtHSHMatmul] A=0X7F8EB6002300 Adesc=[type=R_16F rows=4096 cols=1 "
      "ld=4096] B=0X7F8EB6001B00 Bdesc=[type=R_16F rows=4096 cols=46000 ld=51000] "
      "C=0X7F8EB6003200 Cdesc=[type=R_16F rows=1 cols=46000 ld=1] D=0X7F8EB6003200 "
      "Ddesc=[type=R_16F rows=1 cols=46000 ld=1] computeDesc=[computeType=COMPUTE_32F "
      "scaleType=R_32F transa=OP_T] algo=[algoId=66 tile=MATMUL_TILE_192x8 "
      "stages=MATMUL_STAGES_64xAUTO customOption=3 clusterShape=CLUSTER_SHAPE_2x2x1] "
      "workSpace=0X7F0000000000 workSpaceSizeInBytes=33554432 beta=0 outOfPlace=0 stream=0X0")
# An epilogue with its bias pointer, and fp8 E4M3 with order=ORDER_ROW and its scale pointers:
# the XLA repro's lines verbatim (source of T above; its markdown's ** around EPILOGUE_BIAS
# left out)
LT_EPILOGUE = ("[2023-04-07 04:55:25][cublasLt][7643][Trace][cublasLtMatmul] A=0X7FB506002E80 "
               "Adesc=[type=R_16F rows=32 cols=16 ld=32] B=0X7FB506002A80 Bdesc=[type=R_16F "
               "rows=16 cols=32 ld=16] C=0X7FB506001300 Cdesc=[type=R_16F rows=32 cols=32 ld=32] "
               "D=0X7FB506001300 Ddesc=[type=R_16F rows=32 cols=32 ld=32] computeDesc=["
               "computeType=COMPUTE_32F scaleType=R_32F epilogue=EPILOGUE_BIAS "
               "biasPointer=0x7fb506003280] algo=[algoId=21 tile=MATMUL_TILE_32x32 "
               "stages=MATMUL_STAGES_64x1] workSpace=0X0 workSpaceSizeInBytes=0 beta=0 "
               "outOfPlace=0 stream=0X781AEA0")
LT_FP8 = ("[2023-04-07 04:56:59][cublasLt][8076][Trace][cublasLtMatmul] A=0X7EF80A005600 "
          "Adesc=[type=R_8F_E4M3 rows=32 cols=16 ld=16 order=ORDER_ROW] B=0X7EF80A005200 "
          "Bdesc=[type=R_8F_E4M3 rows=16 cols=64 ld=16] C=0X0 Cdesc=[type=R_16F rows=32 cols=64 "
          "ld=32] D=0X7EF80A004200 Ddesc=[type=R_16F rows=32 cols=64 ld=32] computeDesc=["
          "computeType=COMPUTE_32F scaleType=R_32F aScalePointer=0x7ef80a005800 "
          "bScalePointer=0x7ef80a005880 cScalePointer=0x7f0f4e800500 "
          "dScalePointer=0x7f0f4e800500] algo=[algoId=39 tile=MATMUL_TILE_256x64 "
          "stages=MATMUL_STAGES_128xAUTO] workSpace=0X7EF80A002000 workSpaceSizeInBytes=131 "
          "beta=0 outOfPlace=1 stream=0X8353620")
# cuBLAS 13.x's typed name for a bf16 product, smCountTarget and customOption: the first line
# of a cuBLASLt log parser's self-test fixture, dated 2026-05-04 (public file; find_string
# "[Trace][cublasLtTSTMatmul]"; no repository named); a fixture, so a capture at second hand
LT_13 = ("[2026-05-04 15:08:47][cublasLt][53055][Trace][cublasLtTSTMatmul] A=0X32F600000 "
         "Adesc=[type=R_16BF rows=2048 cols=1024 ld=2048] B=0X32EE00000 Bdesc=[type=R_16BF "
         "rows=1024 cols=32 ld=1024] C=0X32EE10000 Cdesc=[type=R_16BF rows=2048 cols=32 "
         "ld=2048] D=0X32EE10000 Ddesc=[type=R_16BF rows=2048 cols=32 ld=2048] computeDesc=["
         "computeType=COMPUTE_32F scaleType=R_32F smCountTarget=48] algo=[algoId=67 "
         "tile=MATMUL_TILE_64x32 stages=MATMUL_STAGES_64xAUTO customOption=29] workSpace=0X0 "
         "workSpaceSizeInBytes=0 beta=0 outOfPlace=0 stream=0X0")
# Lines of levels 1, 3, 4 and 5 beside the Trace lines, none of them a call:
LT_NOISE = "\n".join([
    # the heuristic's Api line, untyped: an mxfp8 product's (2025-09-10), as a TransformerEngine
    # test script quotes it, its line breaks joined (public file; find_string
    # "[Api][cublasLtMatmulAlgoGetHeuristic]"; no repository named)
    "[2025-09-10 17:32:51][cublasLt][133267][Api][cublasLtMatmulAlgoGetHeuristic] "
    "Adesc=[type=R_8F_E4M3 rows=128 cols=1088 ld=128] Bdesc=[type=R_8F_E4M3 rows=64 cols=1088 "
    "ld=64] Cdesc=[type=R_32F rows=128 cols=64 ld=128] Ddesc=[type=R_32F rows=128 cols=64 "
    "ld=128] preference=[maxWavesCount=0.0 maxWorkspaceSizeinBytes=33554432] computeDesc=["
    "computeType=COMPUTE_32F scaleType=R_32F transb=OP_T aScalePointer=0x78a0ed1fba00 "
    "bScalePointer=0x78a0ed1fcc00 aScaleMode=VEC32_UE8M0 bScaleMode=VEC32_UE8M0]",
    # the typed Api name and its preference, as the split-K check asserts them (LT_SPLIT_K)
    f"{T}[Api][cublasLtSSSMatmulAlgoGetHeuristic] Adesc=[type=R_32F rows=2304 cols=768 "
    "ld=2304] preference=[maxWavesCount=0.0 maxWorkspaceSizeinBytes=33554432 "
    "minBytesAlignmentA=16 minBytesAlignmentB=16 minBytesAlignmentC=16 minBytesAlignmentD=16]",
    # an Error line without a time, verbatim from NVIDIA/CUDALibrarySamples issue #274
    "[cublasLt][702814][Error][cublasLtMatmulAlgoGetHeuristic] The scaling mode for A scale "
    "(VEC16_UE4M3) requires a custom pointer for A scale",
    # no Hints or Info line was found: these two are made up in the documented layout
    f"{T}[Hints][cublasLtMatmulAlgoGetHeuristic] Algo skipped: split-K too large",
    f"{T}[Info][cublasLtMatmulAlgoGetHeuristic] algo=[algoId=1 tile=MATMUL_TILE_64x64] status=OK",
])

# cuBLAS's legacy log, CUBLAS_LOGINFO_DBG=1: the blocks of cuBLAS 13.4.1 verbatim from
# surya-mp/go-peft, docs/cuda-revalidation-benchmarks-2026-09-11.md ("lora-cublas.log"): a
# call's arguments, then its "i! Time:", "i!Process=..." and "i! COMPILED WITH:" lines;
# cublasCreate's "i!Process" line names no stream and no math mode.
TAIL = ("i! Time: 2026-09-11T18:38:49 elapsed from start 0.016667 minutes or 1.000000 seconds\n"
        "i!Process=14102; Thread=129943171284992; GPU=0; Handle=POINTER (IN HEX:0x0x2d3c1100); "
        "StreamId={stream}; MathMode={mode}\n"
        "i! COMPILED WITH: GNU GCC/G++ / 8.5.0 20210514 (Red Hat 8.5.0-26)\n")
DEFAULT_STREAM = "POINTER (IN HEX:0x(nil)) (defaultStream)"
HANDLE = "handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x2d3c1100)"
CREATE = """I! cuBLAS (v13.4.1) function cublasStatus_t cublasCreate_v2(cublasContext**) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x2d3af900)
i! Time: 2026-09-11T18:38:49 elapsed from start 0.016667 minutes or 1.000000 seconds
i!Process=14102; Thread=129943171284992; GPU=0; Handle=POINTER (IN HEX:0x(nil))
i! COMPILED WITH: GNU GCC/G++ / 8.5.0 20210514 (Red Hat 8.5.0-26)
"""
SGEMM = """I! cuBLAS (v13.4.1) function cublasStatus_t cublasSgemm_v2(cublasHandle_t, \
cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float*, int, \
const float*, int, const float*, float*, int) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x2d3c1100)
i!  transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)
i!  transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)
i!  m: type=int; val=2
i!  n: type=int; val=1
i!  k: type=int; val=2
i!  alpha: type=float; val=POINTER (IN HEX:0x0x7ffd937acafc)
i!  A: type=float; val=POINTER (IN HEX:0x0x504e20400)
i!  lda: type=int; val=2
i!  B: type=float; val=POINTER (IN HEX:0x0x504e20600)
i!  ldb: type=int; val=2
i!  beta: type=float; val=POINTER (IN HEX:0x0x7ffd937acaf8)
i!  C: type=float; val=POINTER (IN HEX:0x0x504e20c00)
i!  ldc: type=int; val=2
""" + TAIL.format(stream=DEFAULT_STREAM, mode="CUBLAS_DEFAULT_MATH")
# cuBLAS 12.3's Sgemm block, from JuliaGPU/CUDA.jl issue #2320 (2024-04-10; its reporter's
# JULIA_DEBUG=CUBLAS log of xt_gemm!): CUDA.jl's logger callback prints each line without its
# "I!"/"i!" prefix, behind Julia's "┌ Debug: " and "│ "; here the prefixes are put back and
# Julia's frame left out, the rest verbatim. A call on another stream than the default.
SGEMM_12 = """I! cuBLAS (v12.3) function cublasStatus_t cublasSgemm_v2(cublasHandle_t, \
cublasOperation_t, cublasOperation_t, int, int, int, const float*, const float*, int, \
const float*, int, const float*, float*, int) called:
i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x0x6250fb0)
i!  transa: type=cublasOperation_t; val=CUBLAS_OP_N(0)
i!  transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)
i!  m: type=int; val=1024
i!  n: type=int; val=1024
i!  k: type=int; val=1024
i!  alpha: type=float; val=POINTER (IN HEX:0x0x7f89fcfd9a38)
i!  A: type=float; val=POINTER (IN HEX:0x0x7f898a400000)
i!  lda: type=int; val=1024
i!  B: type=float; val=POINTER (IN HEX:0x0x6200cb800)
i!  ldb: type=int; val=100000
i!  beta: type=float; val=POINTER (IN HEX:0x0x7f89fcfd9a3c)
i!  C: type=float; val=POINTER (IN HEX:0x0x70e776000)
i!  ldc: type=int; val=100000
i! Time: 2024-04-10T21:32:50 elapsed from start 0.316667 minutes or 19.000000 seconds
i!Process=414562; Thread=140230631728704; GPU=0; Handle=POINTER (IN HEX:0x0x6250fb0); \
StreamId=POINTER (IN HEX:0x0x7f899f21b480); MathMode=CUBLAS_DEFAULT_MATH
i! COMPILED WITH: GNU GCC/G++ / 6.3.1 20170216 (Red Hat 6.3.1-3)
"""
DESTROY = ("I! cuBLAS (v13.4.1) function cublasStatus_t cublasDestroy_v2(cublasHandle_t) called:\n"
           f"i!  {HANDLE}\n" + TAIL.format(stream=DEFAULT_STREAM, mode="CUBLAS_DEFAULT_MATH"))


def _block(signature: str, args: list[str], stream: str = DEFAULT_STREAM,
           mode: str = "CUBLAS_DEFAULT_MATH") -> str:
    """One call's block as cuBLAS 13.4.1 prints it (TAIL), of a call no 13.x capture shows."""
    return "\n".join([f"I! cuBLAS (v13.4.1) function cublasStatus_t {signature} called:",
                      *(f"i!  {a}" for a in args)]) + "\n" + TAIL.format(stream=stream, mode=mode)


# cublasGemmEx with every argument, in the order and types of JuliaGPU/CUDA.jl pull request
# #417's cuBLAS 11.0 block ("algo: type=SOME TYPE"), the seed's values; the math mode torch
# sets for fp16 as JuliaGPU/CUDA.jl pull request #424's 11.0 log spells it.
GEMMEX = _block("cublasGemmEx(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, "
                "int, const void*, const void*, cudaDataType_t, int, const void*, "
                "cudaDataType_t, int, const void*, void*, cudaDataType_t, int, "
                "cublasComputeType_t, cublasGemmAlgo_t)", [
                    HANDLE, "transa: type=cublasOperation_t; val=CUBLAS_OP_T(1)",
                    "transb: type=cublasOperation_t; val=CUBLAS_OP_N(0)",
                    "m: type=int; val=46000", "n: type=int; val=1", "k: type=int; val=4096",
                    "alpha: type=void; val=POINTER (IN HEX:0x0x7ffd16a0)",
                    "A: type=void; val=POINTER (IN HEX:0x0x7f0a00000000)",
                    "Atype: type=cudaDataType_t; val=CUDA_R_16F(2)", "lda: type=int; val=51000",
                    "B: type=void; val=POINTER (IN HEX:0x0x7f0a00010000)",
                    "Btype: type=cudaDataType_t; val=CUDA_R_16F(2)", "ldb: type=int; val=4096",
                    "beta: type=void; val=POINTER (IN HEX:0x0x7ffd16a4)",
                    "C: type=void; val=POINTER (IN HEX:0x0x7f0a00020000)",
                    "Ctype: type=cudaDataType_t; val=CUDA_R_16F(2)", "ldc: type=int; val=46000",
                    "computeType: type=cublasComputeType_t; val=CUBLAS_COMPUTE_32F(68)",
                    "algo: type=SOME TYPE; val=CUBLAS_GEMM_DEFAULT_TENSOR_OP(99)"],
                mode="CUBLAS_DEFAULT_MATH | CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION")
LEGACY = GEMMEX  # the product's block alone


def trace_message(line: str) -> tuple[str, str]:
    """(function, message) of a Trace line: what cuBLASLt hands its logger callback."""
    return re.search(r"\[Trace\]\[(\w+)\] (.*)", line).groups()


def set_up(workspace: int = 33554432, create: bool = True) -> str:
    """What torch makes cuBLAS log before a product (aten/src/ATen/cuda/CublasHandlePool.cpp):
    a handle made where none is cached (CREATE), its stream, its workspace and its math mode.
    The argument lines are JuliaGPU/CUDA.jl issue #609's cuBLAS 11.2 log ("streamId: type=SOME
    TYPE", "workspace: type=void", "workspaceSizeInBytes: type=SOME TYPE") and pull request
    #424's 11.0 log ("mode: type=cublasMath_t"), in 13.4.1's block (_block)."""
    return (CREATE if create else "") + "".join([
        _block("cublasSetStream_v2(cublasHandle_t, cudaStream_t)",
               [HANDLE, "streamId: type=SOME TYPE; val=POINTER (IN HEX:0x(nil))"]),
        _block("cublasSetWorkspace_v2(cublasHandle_t, void*, size_t)",
               [HANDLE, "workspace: type=void; val=POINTER (IN HEX:0x0x70fd60000)",
                f"workspaceSizeInBytes: type=SOME TYPE; val={workspace}"]),
        _block("cublasSetMathMode(cublasHandle_t, cublasMath_t)",
               [HANDLE, "mode: type=cublasMath_t; val=CUBLAS_DEFAULT_MATH(0)"])])


def test_a_trace_line_gives_algorithm_tile_stages_split_k_and_reduction_not_the_workspace():
    # Api, Hints, Info and Error lines are not calls
    (call,) = blaslog.lt_calls(LT_SPLIT_K + "\n" + LT_NOISE)
    assert call["function"] == "cublasLtMatmul"
    assert call["types"] == ["R_32F"] * 4
    assert call["compute"] == {"computeType": "COMPUTE_32F", "scaleType": "R_32F", "transa": "OP_T",
                               "smCountTarget": "128"}
    assert call["algo"] == {"algoId": "0", "tile": "MATMUL_TILE_128x64",
                            "reductionScheme": "REDUCTION_SCHEME_COMPUTE_TYPE", "numSplitsK": "14"}
    assert call["workspace"] == 6193152
    assert call["sizes"]["B"] == {"rows": 2304, "cols": 144, "ld": 2304}
    assert blaslog.lt_line(call) == (
        "cuBLASLt cublasLtMatmul R_32F,R_32F,R_32F,R_32F computeType=COMPUTE_32F scaleType=R_32F "
        "transa=OP_T smCountTarget=128 algoId=0 tile=128x64 "
        "reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE numSplitsK=14")
    assert blaslog.handle_state(LT_SPLIT_K + "\n" + LT_NOISE, "")["lt_workspace_bytes"] == [6193152]
    (hopper,) = blaslog.lt_calls(LT)
    assert blaslog.lt_line(hopper).endswith(
        "algoId=66 tile=192x8 stages=64xAUTO customOption=3 clusterShape=2x2x1")


def test_lines_of_cublas_11_12_and_13_read_alike_with_their_typed_names_as_one():
    (old,) = blaslog.lt_calls(LT_11)
    assert blaslog.lt_line(old) == (
        "cuBLASLt cublasLtMatmul R_32F,R_32F,R_32F,R_32F computeType=COMPUTE_32F_FAST_TF32 "
        "scaleType=R_32F smCountTarget=108 algoId=21 tile=128x128 stages=32x5")
    (bias,) = blaslog.lt_calls(LT_EPILOGUE)  # its bias pointer a place, dropped
    assert blaslog.lt_line(bias) == (
        "cuBLASLt cublasLtMatmul R_16F,R_16F,R_16F,R_16F computeType=COMPUTE_32F scaleType=R_32F "
        "epilogue=EPILOGUE_BIAS algoId=21 tile=32x32 stages=64x1")
    (fp8,) = blaslog.lt_calls(LT_FP8)
    assert fp8["types"] == ["R_8F_E4M3[order=ORDER_ROW]", "R_8F_E4M3", "R_16F", "R_16F"]
    assert "ScalePointer" not in blaslog.lt_line(fp8) and fp8["workspace"] == 131
    (thirteen,) = blaslog.lt_calls(LT_13)
    assert blaslog.lt_line(thirteen) == (
        "cuBLASLt cublasLtMatmul R_16BF,R_16BF,R_16BF,R_16BF computeType=COMPUTE_32F "
        "scaleType=R_32F smCountTarget=48 algoId=67 tile=64x32 stages=64xAUTO customOption=29")
    # the same call under the names of cuBLAS 11/12 and 13, with and without the time: one recipe
    tst = LT_11.replace("[cublasLt][3794797]", T).replace("cublasLtSSSMatmul", "cublasLtTSTMatmul")
    assert blaslog.recipe_lines(LT_11, "") == blaslog.recipe_lines(tst, "")
    assert ids.object_id({"full": ["k"] + blaslog.recipe_lines(LT_11, "")}) == \
        ids.object_id({"full": ["k"] + blaslog.recipe_lines(tst, "")})
    # every level from 1 (Error) to 5 (Api): the Trace lines alone are calls, and all are read
    mixed = "\n".join([LT_NOISE, LT_11, LT_NOISE, LT_EPILOGUE, LT_FP8, LT_13, LT_SPLIT_K, LT])
    calls, unread = blaslog.lt_read(mixed)
    assert len(calls) == 6 and unread == []


def test_the_legacy_block_gives_the_call_its_arguments_less_sizes_pointers_and_math_mode():
    (call,) = blaslog.legacy_calls(LEGACY)
    assert call["function"] == "cublasGemmEx"
    # sizes kept in the call, for the reader; places dropped
    assert call["args"]["lda"] == "51000" and call["args"]["m"] == "46000"
    assert not {"handle", "A", "B", "C", "alpha", "beta"} & set(call["args"])
    assert call["math_mode"] == ("CUBLAS_DEFAULT_MATH | "
                                 "CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION")
    assert call["stream"] == "default"
    assert blaslog.legacy_line(call) == (
        "cuBLAS cublasGemmEx(transa=CUBLAS_OP_T, transb=CUBLAS_OP_N, Atype=CUDA_R_16F, "
        "Btype=CUDA_R_16F, Ctype=CUDA_R_16F, computeType=CUBLAS_COMPUTE_32F, "
        "algo=CUBLAS_GEMM_DEFAULT_TENSOR_OP)")


def test_a_real_cublas_13_log_reads_whole():
    """cuBLAS 13.4.1's log of a handle made, a product and the handle destroyed, verbatim: one
    recipe line, nothing unread (cublasCreate's closing line names no stream or math mode)."""
    lines, state = blaslog.read_logs("", CREATE + SGEMM + DESTROY)
    assert lines == ["cuBLAS cublasSgemm_v2(transa=CUBLAS_OP_T, transb=CUBLAS_OP_N)"]
    assert state == {"workspace_bytes": [], "lt_workspace_bytes": [],
                     "math_modes": ["CUBLAS_DEFAULT_MATH"], "streams": ["default"],
                     "unread_lines": 0, "unread": []}


def test_a_real_cublas_12_block_reads_as_13s_do():
    """cuBLAS 12.3's Sgemm block (SGEMM_12): the same fields as 13.4.1's, one recipe line, its
    sizes and places dropped, the stream it names "other"."""
    lines, state = blaslog.read_logs("", SGEMM_12)
    assert lines == ["cuBLAS cublasSgemm_v2(transa=CUBLAS_OP_N, transb=CUBLAS_OP_N)"]
    assert state["streams"] == ["other"] and state["math_modes"] == ["CUBLAS_DEFAULT_MATH"]
    assert state["unread_lines"] == 0
    as_13 = SGEMM.replace("CUBLAS_OP_T(1)", "CUBLAS_OP_N(0)").replace("val=2\n", "val=1024\n")
    assert blaslog.recipe_lines("", as_13) == lines


def test_the_handles_set_up_is_its_state_not_the_recipe():
    """A GemmEx and an Sgemm among the blocks torch's set-up makes cuBLAS 13.x log: each product
    is one recipe line, the same with and without the set-up, and the workspace, math mode and
    stream are the handle's state; whether the handle was made in this call is recorded
    nowhere."""
    for product in (GEMMEX, SGEMM):
        bare = blaslog.recipe_lines("", product)
        logged = set_up() + product + DESTROY
        assert len(bare) == 1 and blaslog.recipe_lines("", logged) == bare
        assert blaslog.recipe_lines("", set_up(workspace=0, create=False) + product) == bare
        assert ids.object_id({"full": ["k"] + bare}) == \
            ids.object_id({"full": ["k"] + blaslog.recipe_lines("", logged)})
    state = blaslog.handle_state(LT, set_up() + GEMMEX + DESTROY)
    assert state == {"workspace_bytes": [33554432], "lt_workspace_bytes": [33554432],
                     "math_modes": ["CUBLAS_DEFAULT_MATH | "
                                    "CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION"],
                     "streams": ["default"], "unread_lines": 0, "unread": []}
    assert blaslog.handle_state(LT, set_up(create=False) + GEMMEX) == state
    # another stream, as JuliaGPU/CUDA.jl pull request #424's log closes a call on one
    sgemm = SGEMM.replace(DEFAULT_STREAM, "POINTER (IN HEX:0x0x2)")
    other = blaslog.handle_state("", set_up(workspace=0) + sgemm)
    assert other["workspace_bytes"] == [0] and other["streams"] == ["other"]
    assert blaslog.merge_states([state, other])["workspace_bytes"] == [0, 33554432]
    assert blaslog.merge_states([]) is None


def test_a_recipe_change_under_the_same_kernel_name_changes_the_kernel_id():
    name = "nvjet_sm90_hsh_512x8_64x16_2x1_v_bz_splitK_TNT"
    split = blaslog.recipe_lines(LT_SPLIT_K, "")
    whole = blaslog.recipe_lines(
        LT_SPLIT_K.replace(" reductionScheme=REDUCTION_SCHEME_COMPUTE_TYPE numSplitsK=14", ""), "")
    assert split != whole
    assert ids.object_id({"full": [name] + split}) != ids.object_id({"full": [name] + whole})
    assert blaslog.recipe_lines(LT_SPLIT_K.replace("algoId=0", "algoId=1"), "") != split
    assert blaslog.recipe_lines(LT.replace("CLUSTER_SHAPE_2x2x1", "CLUSTER_SHAPE_2x1x1"), "") \
        != blaslog.recipe_lines(LT, "")
    # sizes, places and the workspace are not the recipe: another shape, other pointers,
    # another workspace
    moved = LT_SPLIT_K.replace("cols=144", "cols=143").replace("0X7F0A00000000", "0X1")
    assert blaslog.recipe_lines(moved.replace("InBytes=6193152", "InBytes=0"), "") == split


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
    message = trace_message(LT)[1].encode()
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
