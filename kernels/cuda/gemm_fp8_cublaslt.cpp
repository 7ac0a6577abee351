// The FP8 GEMM through cuBLASLt (kernels/cuda/fp8_gemm_cuda.h, rules in kernels/fp8_gemm.h).
//
// Layout. We compute the row-major out[m, n] = a[m, k]·b[n, k]ᵀ. cuBLASLt is column-major, and reads
// each of our row-major buffers as its transpose (kernels/cuda/gemm_cublaslt.cpp explains the swap):
//   - cuBLASLt's A is our b: the buffer [n, k] read column-major is k × n (ld k), with TRANSA = T;
//   - cuBLASLt's B is our a: the buffer [m, k] read column-major is k × m (ld k), with TRANSB = N;
//   - cuBLASLt's D (and C) is our out: n × m (ld n).
// So cuBLASLt computes D (n × m) = op(A)·op(B) = b·aᵀ = outᵀ, which is our out read column-major; its
// m is our n and its n our m. That is the "TN" layout, the only one Hopper's FP8 kernels offer.
// Because A and B swap, cuBLASLt's A scale is our b's scale_inv and its B scale our a's.
//
// Scaling. CUBLASLT_MATMUL_DESC_{A,B}_SCALE_POINTER point at the [1] f32 scale_inv tensors on the
// device (so no step reads them back to the host); cuBLASLt multiplies the f32 sum by both, after
// the sum, and alpha stays 1. beta is 1 with accumulate (C = D = out) and with an addend (C = the
// addend, D = out: cuBLASLt's out-of-place form, C and D of one type and shape), else 0.
// cuBLASLt's heuristic never sees the scale pointers, but cublasLtMatmul answers
// CUBLAS_STATUS_NOT_SUPPORTED for scales that are not 16-byte aligned: [1] views at 4 and 8 bytes
// into a layer's [3] scale_inv state were refused, fresh allocations (256-byte aligned) never are.
// So a scale_inv at any other address is first copied into a fresh scalar on the stream (4 bytes, one
// copy). The training path never needs it: every Fp8Cast's scale_inv is a fresh [1] tensor
// (kernels/fp8.h), and FSDP's FP8 all-gather clones its scale_invs out of the state.
//
// Bias. CUBLASLT_EPILOGUE_BIAS adds a vector per row of cuBLASLt's D, i.e. per our column j < n: the
// [n] bias. cuBLASLt's FP8 type table pairs a bf16 D with a bf16 bias, and (as we read it) an f32 D
// with a bf16 bias too, not an f32 one. Whatever bias cuBLASLt refuses runs unfused: the GEMM, then
// out += bias (in f32 that costs nothing in accuracy; in bf16 it rounds twice). The refusal is logged
// once per problem.
//
// The handle and workspace are the device's shared ones (kernels/cuda/cublaslt_context.h); the call
// goes on the device's current stream. Algorithms are cached per problem key.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/common.h"
#include "kernels/cuda/cublaslt_context.h"
#include "kernels/cuda/fp8_gemm_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/autotune.h"

namespace octet::kernels::cuda {

namespace {

using cublaslt::alignment_of;
using cublaslt::AlgoCache;
using cublaslt::choose_algo;
using cublaslt::check_lt;
using cublaslt::cuda_type;
using cublaslt::Layout;
using cublaslt::MatmulDesc;

// The device's compute capability as major·10 + minor, asked once per device (this is on every
// FP8 GEMM's path).
int compute_capability(int device) {
  static std::array<std::atomic<int>, 64> known{};
  OCTET_CHECK(device >= 0 && device < static_cast<int>(known.size()), "fp8_gemm: CUDA device index ", device,
              " is out of range");
  int cc = known[device].load(std::memory_order_relaxed);
  if (cc == 0) {
    int major = 0, minor = 0;
    octet::cuda::check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
                       "fp8_gemm: cudaDeviceGetAttribute");
    octet::cuda::check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
                       "fp8_gemm: cudaDeviceGetAttribute");
    cc = major * 10 + minor;
    known[device].store(cc, std::memory_order_relaxed);
  }
  return cc;
}

// FP8 tensor cores arrived with sm_89 (Ada) and sm_90 (Hopper).
void check_fp8_capable(int device, const Tensor& a, const Tensor& b, const Tensor& out) {
  const int cc = compute_capability(device);
  OCTET_CHECK(cc >= 89, "fp8_gemm: ", out.device().str(), " is sm_", cc,
              ", and FP8 GEMMs need compute capability 8.9 or newer (sm_89 Ada, sm_90 Hopper) (",
              describe_all({&a, &b, &out}), "); run this layer in bf16 (outside fp8_autocast)");
}

std::string problem_text(const Tensor& a, const Tensor& b, const Tensor& out, bool with_bias, bool fast_accumulate) {
  return "a[" + std::to_string(a.size(0)) + ", " + std::to_string(a.size(1)) + "]·b[" + std::to_string(b.size(0)) +
         ", " + std::to_string(b.size(1)) + "]ᵀ (" + describe_all({&a, &b, &out}) +
         ", alignments a " + std::to_string(alignment_of(a.data_ptr())) + " B, b " +
         std::to_string(alignment_of(b.data_ptr())) + " B, out " + std::to_string(alignment_of(out.data_ptr())) +
         " B, epilogue " + (with_bias ? "BIAS" : "none") + ", fast_accumulate=" + std::to_string(fast_accumulate) + ")";
}

// Everything the heuristic's answer depends on: device, m, n, k, the three dtypes, bias (and its
// dtype and alignment), fast accumulation, whether C is read, the operand alignments, and whether
// the algorithm was measured (kernels/autotune.h).
using Fp8AlgoKey = std::array<int64_t, 17>;

AlgoCache<Fp8AlgoKey>& algo_cache() {
  static AlgoCache<Fp8AlgoKey> cache;
  return cache;
}

void note_unfused_bias(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& bias, bool fast_accumulate,
                       cublasStatus_t status) {
  logging::info("cuBLASLt offers no FP8 algorithm with a fused {} bias for {} ({}); adding the bias unfused",
                dtype_name(bias.dtype()), problem_text(a, b, out, true, fast_accumulate),
                cublasLtGetStatusName(status));
}

// Said once per problem key, as the bias's (the refusal is cached): an addend cuBLASLt will not read
// as C (an out-of-place C) is added after the GEMM.
void note_unfused_addend(const Tensor& a, const Tensor& b, const Tensor& out, const Tensor& addend,
                         bool fast_accumulate, cublasStatus_t status) {
  logging::info("cuBLASLt offers no FP8 algorithm that reads the {} addend as C for {} ({}); adding it unfused",
                addend.describe(), problem_text(a, b, out, false, fast_accumulate), cublasLtGetStatusName(status));
}

// One cuBLASLt FP8 matmul, with the BIAS epilogue when `bias` is defined. Returns false, having
// written nothing, when cuBLASLt has no algorithm (or, with a bias or an addend read as C, refuses
// in any way: fp8_gemm then adds what was refused itself); throws on any other failure.
bool run_fp8_lt(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b,
                const Tensor& out, const Tensor& bias, bool accumulate, bool fast_accumulate, const Tensor& addend) {
  const int device = out.device().index;
  cublaslt::DeviceContext& ctx = cublaslt::context_for(device);
  cudaStream_t stream = octet::cuda::current_stream(device);
  const int64_t m = a.size(0), k = a.size(1), n = b.size(0);
  const bool with_bias = bias.defined();
  // A refusal of the epilogue or of an out-of-place C, from the heuristic or from the matmul itself.
  const bool may_refuse = with_bias || addend.defined();

  MatmulDesc desc;
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);  // cuBLASLt's A is our b, stored k × n
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);  // cuBLASLt's B is our a, stored k × m
  const void* lt_a_scale = scale_inv_b.data_ptr();
  const void* lt_b_scale = scale_inv_a.data_ptr();
  desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, lt_a_scale);
  desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, lt_b_scale);
  const int8_t fast_accum = fast_accumulate ? 1 : 0;
  desc.set(CUBLASLT_MATMUL_DESC_FAST_ACCUM, fast_accum);
  const cublasLtEpilogue_t epilogue = with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, epilogue);
  if (with_bias) {
    const void* bias_ptr = bias.data_ptr();
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<int32_t>(cuda_type(bias.dtype())));
  }

  const Layout lt_a(b.dtype(), n, k);    // our b [n, k]: column-major k × n, ld k
  const Layout lt_b(a.dtype(), m, k);    // our a [m, k]: column-major k × m, ld k
  const Layout lt_d(out.dtype(), m, n);  // our out [m, n]: column-major n × m, ld n

  const uint32_t align_a = alignment_of(a.data_ptr()), align_b = alignment_of(b.data_ptr());
  // C is read from the addend when there is one: C's and D's alignment is the least of the two.
  const void* c_read = addend.defined() ? addend.data_ptr() : out.data_ptr();
  const uint32_t align_out = std::min(alignment_of(out.data_ptr()), alignment_of(c_read));
  const Fp8AlgoKey key{device,
                       m,
                       n,
                       k,
                       static_cast<int64_t>(a.dtype()),
                       static_cast<int64_t>(b.dtype()),
                       static_cast<int64_t>(out.dtype()),
                       with_bias,
                       with_bias ? static_cast<int64_t>(bias.dtype()) : -1,
                       with_bias ? alignment_of(bias.data_ptr()) : 0,
                       fast_accumulate,
                       accumulate,
                       addend.defined(),
                       align_a,
                       align_b,
                       align_out,
                       autotune_enabled()};

  // alpha and beta are host floats (the scale type of CUBLAS_COMPUTE_32F); the operand scales are
  // applied through the scale pointers.
  const float alpha = 1.0f, beta = accumulate || addend.defined() ? 1.0f : 0.0f;
  auto run = [&](const cublasLtMatmulAlgo_t& algo, const void* c_in, void* d) {
    return cublasLtMatmul(ctx.handle, desc.desc, &alpha, b.data_ptr(), lt_a.layout, a.data_ptr(), lt_b.layout, &beta,
                          c_in, lt_d.layout, d, lt_d.layout, &algo, ctx.workspace, cublaslt::kWorkspaceBytes, stream);
  };
  // Autotuning's trials (kernels/autotune.h) write out, which the real run writes again after
  // them, unless out is also the C they read (accumulate): then in place on a copy of out
  // (cublaslt::TrialCopyOfOutput).
  cublaslt::TrialCopyOfOutput copy(out, m * n, stream);
  auto trial = [&](const cublasLtMatmulAlgo_t& candidate) {
    if (beta != 0.f && c_read == out.data_ptr()) {
      void* in_place = copy.get();
      return run(candidate, in_place, in_place);
    }
    return run(candidate, c_read, out.data_ptr());
  };

  // NOT_SUPPORTED means "no algorithm for this configuration". A bias epilogue or an addend
  // rejected in any way falls back to the unfused add instead of failing.
  const std::optional<cublasLtMatmulAlgo_t> algo = algo_cache().get(key, [&] {
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    std::optional<cublasLtMatmulAlgo_t> found =
        choose_algo(ctx.handle, desc, lt_a, lt_b, lt_d, align_b, align_a, align_out, may_refuse, status, stream, trial,
                    [&] { return "FP8 " + problem_text(a, b, out, with_bias, fast_accumulate); });
    if (!found && with_bias) note_unfused_bias(a, b, out, bias, fast_accumulate, status);
    if (!found && !with_bias && addend.defined()) note_unfused_addend(a, b, out, addend, fast_accumulate, status);
    return found;
  });
  if (!algo) return false;

  const cublasStatus_t status = run(*algo, c_read, out.data_ptr());
  if (may_refuse && (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE)) {
    if (with_bias) {
      note_unfused_bias(a, b, out, bias, fast_accumulate, status);
    } else {
      note_unfused_addend(a, b, out, addend, fast_accumulate, status);
    }
    algo_cache().refuse(key);
    return false;
  }
  check_lt(status, "cublasLtMatmul (FP8)");
  return true;
}

// out[i, j] += bias[j], on out's stream: the unfused bias.
void add_bias(const Tensor& out, const Tensor& bias) { add_(out, broadcast_to(bias, out.shape())); }

// The alignment cuBLASLt needs of a scale pointer (see the top of the file).
constexpr uint32_t kScaleAlignment = 16;

// `scale_inv` itself when cuBLASLt can read it where it is, else a copy of it in a fresh (aligned)
// allocation, made on the current stream, which the GEMM queued after it reads.
Tensor readable_scale(const Tensor& scale_inv) {
  if (alignment_of(scale_inv.data_ptr()) >= kScaleAlignment) return scale_inv;
  return scale_inv.clone();
}

}  // namespace

void fp8_gemm(const Tensor& a, const Tensor& scale_inv_a, const Tensor& b, const Tensor& scale_inv_b, const Tensor& out,
              const Tensor& bias, bool accumulate, bool fast_accumulate, const Tensor& addend) {
  if (out.numel() == 0) return;
  const int device = out.device().index;
  octet::cuda::DeviceGuard device_guard(device);
  check_fp8_capable(device, a, b, out);
  if (a.size(1) == 0) {  // k = 0: the sum is empty, out = (accumulate ? out : addend or 0) + bias
    if (addend.defined()) {
      out.copy_(addend);
    } else if (!accumulate) {
      octet::cuda::check(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), octet::cuda::current_stream(device)),
                         "fp8_gemm: cudaMemsetAsync");
    }
    if (bias.defined()) add_bias(out, bias);
    return;
  }
  const Tensor scale_a = readable_scale(scale_inv_a), scale_b = readable_scale(scale_inv_b);
  if (bias.defined() && run_fp8_lt(a, scale_a, b, scale_b, out, bias, accumulate, fast_accumulate, addend)) return;
  // What cuBLASLt refuses runs unfused, each later term added and rounded in turn: a bias (f32 out),
  // then an addend it will not read as C (one at an address it cannot take).
  bool added = !addend.defined();
  if (!run_fp8_lt(a, scale_a, b, scale_b, out, Tensor(), accumulate, fast_accumulate, addend)) {
    if (added || !run_fp8_lt(a, scale_a, b, scale_b, out, Tensor(), accumulate, fast_accumulate, Tensor())) {
      OCTET_FAIL("fp8_gemm: cuBLASLt has no FP8 algorithm for ", problem_text(a, b, out, false, fast_accumulate),
                 "; FP8 GEMMs need an sm_89/sm_90 GPU, k and n multiples of 16 and operands at 16-byte aligned "
                 "addresses (a view at another offset is not): copy the operands into fresh tensors");
    }
  } else {
    added = true;
  }
  if (!added) add_(out, addend);
  if (bias.defined()) add_bias(out, bias);
}

}  // namespace octet::kernels::cuda
