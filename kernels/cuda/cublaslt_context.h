#pragma once
// What the cuBLASLt GEMMs share (kernels/cuda/gemm_cublaslt.cpp and gemm_fp8_cublaslt.cpp): the
// per-device handle and workspace, the status check, and owning wrappers for the descriptors.
// Internal to kernels/cuda: it includes cublasLt.h, so only CUDA-build sources include it.
//
// Each device has one cuBLASLt handle and one 32 MiB workspace, made on first use. The workspace is
// shared by every stream of the device, so GEMMs on one device must not run on two streams at once;
// Octet issues all of them on the compute stream.
#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/tensor.h"

namespace octet::kernels::cuda::cublaslt {

inline constexpr size_t kWorkspaceBytes = size_t{32} << 20;

// Throws an octet::Error naming `what` and the cuBLASLt status unless it is CUBLAS_STATUS_SUCCESS.
void check_lt(cublasStatus_t status, const char* what);

struct DeviceContext {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;  // kWorkspaceBytes
};

// The device's handle and workspace, created on first use; they live until the process exits.
DeviceContext& context_for(int device);

// cuBLASLt's element type for f32, bf16, f16, e4m3 and e5m2; throws for any other dtype.
cudaDataType_t cuda_type(DType dtype);

// The largest power of two up to 256 dividing the address: cuBLASLt assumes 256-byte aligned
// pointers unless told otherwise, and views at an offset (flat parameters) can be less aligned.
uint32_t alignment_of(const void* p);

// Owning wrappers for the descriptors, destroyed on every path out (errors included).
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  // f32 accumulation (never TF32) with f32 alpha, beta and scale factors.
  MatmulDesc() { check_lt(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate"); }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    check_lt(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
  }
};

// A row-major [rows, cols] buffer as cuBLASLt's column-major cols × rows matrix (ld = cols), with
// `batch` matrices `stride` elements apart.
struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  Layout(DType dtype, int64_t rows, int64_t cols, int64_t batch = 1, int64_t stride = 0);
  ~Layout() { cublasLtMatrixLayoutDestroy(layout); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { check_lt(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate"); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
    check_lt(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(value)),
             "cublasLtMatmulPreferenceSetAttribute");
  }
};

// The heuristic's algorithms for `desc` with cuBLASLt's A, B and C = D layouts, the shared
// workspace, and the operands' alignments in bytes, best first, at most `count`. Empty when cuBLASLt
// has none for it (NOT_SUPPORTED, or no result); `status` receives what the heuristic returned. Any
// other failure throws, unless `failure_is_refusal` (a fused epilogue, which the caller runs
// unfused instead).
std::vector<cublasLtMatmulAlgo_t> heuristic_algos(cublasLtHandle_t handle, const MatmulDesc& desc, const Layout& a,
                                                  const Layout& b, const Layout& cd, uint32_t align_a,
                                                  uint32_t align_b, uint32_t align_cd, int count,
                                                  bool failure_is_refusal, cublasStatus_t& status);

// One cublasLtMatmul of the problem with `algo`, its operands bound in by the caller, on the stream
// the problem runs on, writing only what the real run writes again afterwards (or scratch):
// autotuning times candidates with it.
using TrialRun = std::function<cublasStatus_t(const cublasLtMatmulAlgo_t&)>;

// Autotuning's trials of a GEMM that accumulates into its output (C and D one buffer, beta != 0) run
// in place on a copy of that buffer, made on `stream` at the first trial (get()): C is added once, by
// the real run, and each candidate is tried as it will run, reading C from the buffer it writes.
class TrialCopyOfOutput {
 public:
  TrialCopyOfOutput(const Tensor& out, int64_t elements, cudaStream_t stream)
      : out_(out), elements_(elements), stream_(stream) {}
  void* get();

 private:
  const Tensor& out_;
  int64_t elements_;
  cudaStream_t stream_;
  Tensor copy_;
};

// The algorithm for a problem not seen before (kernels/autotune.h): the heuristic's first with
// autotuning off; with it on, the one autotune_pick keeps of the heuristic's first
// kAutotuneCandidates, each run by `trial` on `stream`, once untimed and then kAutotuneTimedRuns
// times between events. `what` names the problem in the log line that reports the choice. nullopt
// and `status` as for heuristic_algos (or when no candidate ran).
std::optional<cublasLtMatmulAlgo_t> choose_algo(cublasLtHandle_t handle, const MatmulDesc& desc, const Layout& a,
                                                const Layout& b, const Layout& cd, uint32_t align_a, uint32_t align_b,
                                                uint32_t align_cd, bool failure_is_refusal, cublasStatus_t& status,
                                                cudaStream_t stream, const TrialRun& trial,
                                                const std::function<std::string()>& what);

// Algorithms per problem key for the life of the process. nullopt records "no algorithm", so that a
// refused configuration is asked about (and logged) once, not every step.
template <class Key>
class AlgoCache {
 public:
  using Entry = std::optional<cublasLtMatmulAlgo_t>;
  // The entry for `key`, or `ask()`'s answer, remembered: the lock makes concurrent callers ask once.
  template <class Ask>
  Entry get(const Key& key, Ask&& ask) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = entries_.find(key);
    if (it != entries_.end()) return it->second;
    return entries_[key] = ask();
  }
  // For an algorithm cuBLASLt offered but then refused to run.
  void refuse(const Key& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    entries_[key] = std::nullopt;
  }

 private:
  std::map<Key, Entry> entries_;
  std::mutex mutex_;
};

}  // namespace octet::kernels::cuda::cublaslt
