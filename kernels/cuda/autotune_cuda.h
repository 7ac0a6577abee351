#pragma once
// Autotuning's timing on the GPU (kernels/autotune.h), shared by the cuBLASLt GEMMs
// (cublaslt_context.cpp) and cuDNN attention (cudnn_graph.cpp). Internal to kernels/cuda.
#include <cuda_runtime_api.h>

#include <functional>
#include <string>

namespace octet::kernels::cuda {

// Times `count` candidates of one problem: run(i) queues candidate i once on `stream` and returns
// false when the library refuses it. Each runs once untimed, then kAutotuneTimedRuns times between
// CUDA events; waits for the stream after each candidate. Returns the index autotune_pick keeps of
// their medians (-1 when none ran), counts the problem (autotuned_problems), and logs the choice as
// "autotune: <what()>: <kind> i of n (its time; the first's)".
int time_candidates(cudaStream_t stream, int count, const std::function<bool(int)>& run, const char* kind,
                    const std::function<std::string()>& what);

}  // namespace octet::kernels::cuda
