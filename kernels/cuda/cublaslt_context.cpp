// The shared cuBLASLt pieces (kernels/cuda/cublaslt_context.h).
#include "kernels/cuda/cublaslt_context.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <string>
#include <vector>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "kernels/autotune.h"
#include "kernels/cuda/autotune_cuda.h"

namespace octet::kernels::cuda::cublaslt {

namespace {
constexpr int kMaxDevices = 64;
}  // namespace

void check_lt(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  OCTET_FAIL("cuBLASLt ", what, ": ", cublasLtGetStatusName(status), " (", cublasLtGetStatusString(status), ")");
}

// The handle and workspace live until the process exits: freeing them from a static destructor
// would race the CUDA runtime's own teardown. cudaMalloc (not the stream-ordered pool) so that the
// workspace is valid on every stream from the start.
DeviceContext& context_for(int device) {
  OCTET_CHECK(device >= 0 && device < kMaxDevices, "cuBLASLt: CUDA device index ", device, " is out of range");
  static std::array<DeviceContext, kMaxDevices> contexts{};
  static std::array<std::once_flag, kMaxDevices> created;
  std::call_once(created[device], [device] {
    DeviceContext& ctx = contexts[device];
    check_lt(cublasLtCreate(&ctx.handle), "cublasLtCreate");
    octet::cuda::check(cudaMalloc(&ctx.workspace, kWorkspaceBytes), "cudaMalloc (cuBLASLt workspace)");
  });
  return contexts[device];
}

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    case DType::e5m2: return CUDA_R_8F_E5M2;
    default: OCTET_FAIL("cuBLASLt: no element type for ", dtype_name(dtype));
  }
}

uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

Layout::Layout(DType dtype, int64_t rows, int64_t cols, int64_t batch, int64_t stride) {
  check_lt(cublasLtMatrixLayoutCreate(&layout, cuda_type(dtype), static_cast<uint64_t>(cols),
                                      static_cast<uint64_t>(rows), cols),
           "cublasLtMatrixLayoutCreate");
  if (batch > 1) {
    const auto count = static_cast<int32_t>(batch);
    check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
             "cublasLtMatrixLayoutSetAttribute");
    check_lt(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                              sizeof(stride)),
             "cublasLtMatrixLayoutSetAttribute");
  }
}

std::vector<cublasLtMatmulAlgo_t> heuristic_algos(cublasLtHandle_t handle, const MatmulDesc& desc, const Layout& a,
                                                  const Layout& b, const Layout& cd, uint32_t align_a,
                                                  uint32_t align_b, uint32_t align_cd, int count,
                                                  bool failure_is_refusal, cublasStatus_t& status) {
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, kWorkspaceBytes);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_cd);
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_cd);
  std::vector<cublasLtMatmulHeuristicResult_t> results(static_cast<size_t>(count));
  int returned = 0;
  status = cublasLtMatmulAlgoGetHeuristic(handle, desc.desc, a.layout, b.layout, cd.layout, cd.layout, pref.pref, count,
                                          results.data(), &returned);
  if (status != CUBLAS_STATUS_NOT_SUPPORTED && !failure_is_refusal) check_lt(status, "cublasLtMatmulAlgoGetHeuristic");
  std::vector<cublasLtMatmulAlgo_t> algos;
  if (status != CUBLAS_STATUS_SUCCESS) return algos;
  for (int i = 0; i < returned; ++i) {
    if (results[i].state == CUBLAS_STATUS_SUCCESS) algos.push_back(results[i].algo);
  }
  return algos;
}

namespace {

// Whether `algo` adds split-K partial sums in a type narrower than f32 (in place in D, or in D's
// type): extra roundings the heuristic's first choice is not known to make. An algorithm whose
// scheme cannot be read is kept.
bool reduces_below_f32(const cublasLtMatmulAlgo_t& algo) {
  uint32_t scheme = CUBLASLT_REDUCTION_SCHEME_NONE;
  size_t written = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &scheme, sizeof(scheme),
                                           &written) != CUBLAS_STATUS_SUCCESS) {
    return false;
  }
  return scheme == CUBLASLT_REDUCTION_SCHEME_INPLACE || scheme == CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE;
}

}  // namespace

void* TrialCopyOfOutput::get() {
  if (!copy_.defined()) {
    copy_ = empty({elements_}, out_.dtype(), out_.device());
    octet::cuda::check(cudaMemcpyAsync(copy_.data_ptr(), out_.data_ptr(), copy_.nbytes(), cudaMemcpyDeviceToDevice,
                                       stream_),
                       "cublasLtMatmul: cudaMemcpyAsync (autotuning's copy of C)");
  }
  return copy_.data_ptr();
}

std::optional<cublasLtMatmulAlgo_t> choose_algo(cublasLtHandle_t handle, const MatmulDesc& desc, const Layout& a,
                                                const Layout& b, const Layout& cd, uint32_t align_a, uint32_t align_b,
                                                uint32_t align_cd, bool failure_is_refusal, cublasStatus_t& status,
                                                cudaStream_t stream, const TrialRun& trial,
                                                const std::function<std::string()>& what) {
  const bool tune = autotune_enabled();
  std::vector<cublasLtMatmulAlgo_t> candidates = heuristic_algos(
      handle, desc, a, b, cd, align_a, align_b, align_cd, tune ? kAutotuneCandidates : 1, failure_is_refusal, status);
  if (candidates.empty()) return std::nullopt;
  if (!tune) return candidates.front();

  // The heuristic's first stays a candidate whatever it does (it is what runs with autotuning off);
  // the others only if they sum in f32.
  candidates.erase(std::remove_if(candidates.begin() + 1, candidates.end(), reduces_below_f32), candidates.end());
  cublasStatus_t refusal = CUBLAS_STATUS_SUCCESS;
  const int pick = time_candidates(
      stream, static_cast<int>(candidates.size()),
      [&](int i) {
        // A refusal (the algorithm cannot take this problem) is a false trial; any other failure is the
        // GPU's, and is thrown rather than taken for a refusal.
        const cublasStatus_t s = trial(candidates[i]);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || s == CUBLAS_STATUS_INVALID_VALUE) {
          refusal = s;
          return false;
        }
        check_lt(s, "cublasLtMatmul (an autotuning trial)");
        return true;
      },
      "cuBLASLt algorithm", what);
  if (pick < 0) {
    status = refusal;  // what cuBLASLt said to the last one, for the caller's message
    return std::nullopt;
  }
  return candidates[pick];
}

}  // namespace octet::kernels::cuda::cublaslt
