#pragma once
// Autotuning: how the GPU libraries' algorithms are chosen for a problem not run before. Two
// choices depend on it:
//   - cuBLASLt's algorithm for a GEMM (bf16/f16/f32 and FP8: kernels/cuda/gemm_cublaslt.cpp,
//     gemm_fp8_cublaslt.cpp); a problem is everything the choice depends on: shapes, dtypes,
//     transposes, epilogue, whether C is read, and each pointer's alignment;
//   - cuDNN's engine configuration for fused attention, forward and backward
//     (kernels/cuda/attention_cudnn.cpp); a problem is the layout, B, H, S, Sk, D, dtype and scale.
//
// Off (the default): the first candidate the library's heuristics offer. It is the same one in every
// run on the same GPU and libraries, so a run repeats bit for bit.
//
// On: the first time a problem runs, up to kAutotuneCandidates of the heuristics' candidates each run
// on the problem's own tensors, once untimed and then kAutotuneTimedRuns times between CUDA events
// on the compute stream; the fastest median wins (autotune_pick), and the problem keeps it for the
// life of the process. The heuristics rank by a model of the GPU; timing finds what the model
// misses, most of all wave quantization: on the first H200 run, ViT-H's fc1 and fc2 weight
// gradients at batch 64 ran as 200 output tiles of 128 x 256 on a grid of 120 blocks (1.67 waves),
// at 663 TFLOP/s where the step's other GEMMs ran at 690-790; and attention has 197 tokens, no
// multiple of its kernels' 64- and 128-token tiles, in heads of 80.
//
// The cost, on the first step: 6 runs of each candidate and one host synchronisation per candidate
// (counted: core/host_sync.h), tens of milliseconds for one of ViT-H's large GEMMs, and for
// attention cuDNN's finalizing of each candidate plan. Outputs are safe: a GEMM that accumulates into
// its output (beta = 1, C = D) writes its trials into a scratch matrix; every other output a trial
// writes (D, a bias gradient, the GELU's aux matrix, attention's output, its statistics and its
// gradients) is written again by the real run after the trials. Sums stay as wide: a GEMM candidate
// that would add split-K partial sums in a type narrower than f32 is left out (the heuristics' first
// is always a candidate, as it runs with autotuning off). The price: which candidate wins can change
// with timing noise between runs, and two candidates may add in a different order, so results are
// reproducible only with it off.
#include <vector>

namespace octet::kernels {

void set_autotune(bool on);
bool autotune_enabled();

// How many of the heuristics' candidates are timed, and how often each.
inline constexpr int kAutotuneCandidates = 16;
inline constexpr int kAutotuneTimedRuns = 5;
// Another candidate replaces the heuristics' first only when it is faster by more than this share
// of the first's time: run-to-run noise of a few microseconds must not swap algorithms for nothing.
inline constexpr double kAutotuneMargin = 0.02;

// The candidate to keep, given each one's median time in order of the heuristics' ranking (a
// negative time: the candidate did not run). Index 0 unless another is faster than it by more than
// `margin` of its time, then the fastest; if index 0 did not run, the fastest that did; -1 if none ran.
int autotune_pick(const std::vector<double>& seconds, double margin = kAutotuneMargin);

// Problems tuned so far in this process (for tests and logs).
int autotuned_problems();
void count_autotuned_problem();

}  // namespace octet::kernels
