#pragma once
// GEMM autotuning: how the GPU GEMMs (bf16/f16/f32 and FP8, kernels/cuda/gemm_cublaslt.cpp and
// gemm_fp8_cublaslt.cpp) choose cuBLASLt's algorithm for a problem they have not run before. A
// problem is everything the choice depends on: shapes, dtypes, transposes, epilogue, whether C is
// read, and each pointer's alignment.
//
// Off (the default): the first algorithm cuBLASLt's heuristic offers. It is the same algorithm in
// every run on the same GPU and library, so a run repeats bit for bit.
//
// On: the first time a problem runs, the heuristic's first kAutotuneCandidates algorithms each run
// on the problem's own operands, once untimed and then kAutotuneTimedRuns times between CUDA events
// on the compute stream; the fastest median wins (autotune_pick), and the problem keeps it for the
// life of the process. The heuristic ranks by a model of the GPU; timing finds what the model
// misses, most of all wave quantization: on the first H200 run, ViT-H's fc1 and fc2 weight
// gradients at batch 64 ran as 200 output tiles of 128 x 256 on a grid of 120 blocks (1.67 waves),
// at 663 TFLOP/s where the step's other GEMMs ran at 690-790. It costs one host synchronisation and
// about 6 x 16 GEMMs per problem, on the first step. The output and accumulator are safe: a GEMM that accumulates
// into its output (beta = 1, C = D) writes its trials into a scratch matrix, and every other
// output the trials write (D, a bias gradient, the GELU's aux matrix) is written again by the real
// run after them. The price: which algorithm wins can change with timing noise between runs, and
// two algorithms may round an f32 sum in a different order, so results are reproducible only with
// it off. Every algorithm still accumulates in f32.
#include <vector>

namespace octet::kernels {

void set_gemm_autotune(bool on);
bool gemm_autotune();

// How many of the heuristic's algorithms are timed, and how often each.
inline constexpr int kAutotuneCandidates = 16;
inline constexpr int kAutotuneTimedRuns = 5;
// Another algorithm replaces the heuristic's first only when it is faster by more than this share
// of the first's time: run-to-run noise of a few microseconds must not swap algorithms for nothing.
inline constexpr double kAutotuneMargin = 0.02;

// The candidate to keep, given each one's median time in order of the heuristic's ranking (a
// negative time: the candidate did not run). Index 0 unless another is faster than it by more than
// `margin` of its time, then the fastest; if index 0 did not run, the fastest that did; -1 if none ran.
int autotune_pick(const std::vector<double>& seconds, double margin = kAutotuneMargin);

// Problems tuned so far in this process (for tests and logs).
int gemm_autotuned_problems();
void count_gemm_autotuned_problem();

}  // namespace octet::kernels
