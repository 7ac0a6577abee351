// GEMM through cuBLASLt (kernels/cuda/gemm_cuda.h).
//
// Row-major to column-major. cuBLASLt is column-major: a row-major [r, c] buffer, read column-major
// with leading dimension c, is the c × r matrix that is its transpose. Octet asks for the row-major
// C = op(A)·op(B) (C is m × n). Transposing both sides gives Cᵀ = op(B)ᵀ·op(A)ᵀ, and every matrix in
// that product is exactly what cuBLASLt sees when it reads our row-major buffers:
//   - Cᵀ (n × m, ld n) is our C buffer read column-major;
//   - op(B)ᵀ (n × k): b's buffer read column-major is bᵀ, so cuBLASLt's A is our b with
//     transa = trans_b (b stored [k, n] reads as n × k directly; stored [n, k] it reads as k × n and
//     needs the transpose);
//   - op(A)ᵀ (k × m): likewise cuBLASLt's B is our a with transb = trans_a.
// So each call swaps the operands, keeps their transpose flags, and swaps m and n. Epilogues follow:
// cuBLASLt's "rows of D" are our columns j < n and its "columns of D" our rows i < m.
//
// Each device has one cuBLASLt handle and one 32 MiB workspace (kernels/cuda/cublaslt_context.h,
// shared with the FP8 GEMM). The call goes on the device's current stream (core/cuda_stream.h).
// Algorithms from cublasLtMatmulAlgoGetHeuristic are cached per problem key.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <optional>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "core/log.h"
#include "kernels/common.h"
#include "kernels/cuda/cublaslt_context.h"
#include "kernels/cuda/gemm_cuda.h"
#include "kernels/elementwise.h"
#include "kernels/autotune.h"

namespace octet::kernels::cuda {

namespace {

using cublaslt::alignment_of;
using cublaslt::check_lt;
using cublaslt::context_for;
using cublaslt::cuda_type;
using cublaslt::DeviceContext;
using cublaslt::kWorkspaceBytes;
using cublaslt::AlgoCache;
using cublaslt::choose_algo;
using cublaslt::Layout;
using cublaslt::MatmulDesc;

// Everything the heuristic's answer depends on, and whether C is read (beta != 0), since an
// algorithm cuBLASLt refuses at run time is remembered under the key too. Leading dims and strides
// follow from m, n, k and the transposes (tensors are contiguous); a shared b is in the key. So is
// whether the algorithm was measured (kernels/autotune.h), so that switching autotuning on
// tunes the problems that already ran.
using AlgoKey = std::array<int64_t, 19>;

AlgoCache<AlgoKey>& algo_cache() {
  static AlgoCache<AlgoKey> cache;
  return cache;
}

cublasLtEpilogue_t lt_epilogue(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::BiasGradFromA: return CUBLASLT_EPILOGUE_BGRADB;
    case GemmEpilogue::GeluAuxBias: return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

void check_operands(const Tensor& a, const Tensor& b, const Tensor& c) {
  OCTET_CHECK(a.dtype() == b.dtype() && (a.dtype() == DType::f32 || a.dtype() == DType::bf16 || a.dtype() == DType::f16),
              "gemm: on the GPU both operands must be f32, bf16 or f16 and of one dtype (",
              describe_all({&a, &b, &c}), "); convert one with .to(dtype)");
  OCTET_CHECK(c.dtype() == a.dtype() || c.dtype() == DType::f32, "gemm: on the GPU the output must be the operands' dtype (",
              dtype_name(a.dtype()), ") or f32 (", describe_all({&a, &b, &c}), ")");
  OCTET_CHECK(a.device() == c.device() && b.device() == c.device(), "gemm: operands on different devices (",
              describe_all({&a, &b, &c}), ")");
}

const char* epilogue_name(GemmEpilogue kind) {
  switch (kind) {
    case GemmEpilogue::None: return "none";
    case GemmEpilogue::Bias: return "BIAS";
    case GemmEpilogue::BiasGradFromA: return "BGRADB";
    case GemmEpilogue::GeluAuxBias: return "GELU_AUX_BIAS";
  }
  return "?";
}

std::string problem_text(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                         const GemmProblem& p, GemmEpilogue epilogue) {
  return "op(a)[" + std::to_string(p.m) + ", " + std::to_string(p.k) + "]·op(b)[" + std::to_string(p.k) + ", " +
         std::to_string(p.n) + "] x " + std::to_string(p.batch) + " batches (" + describe_all({&a, &b, &c}) +
         ", trans_a=" + std::to_string(trans_a) + ", trans_b=" + std::to_string(trans_b) + ", epilogue " +
         epilogue_name(epilogue) + ")";
}

// An epilogue cuBLASLt will not run is not an error: the caller computes the same thing unfused.
// Said once per problem key (the refusal is cached).
void note_unfused(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, const GemmProblem& p,
                  GemmEpilogue epilogue, cublasStatus_t status) {
  logging::info("cuBLASLt offers no algorithm for {} ({}); running it unfused",
                problem_text(a, trans_a, b, trans_b, c, p, epilogue), cublasLtGetStatusName(status));
}

// The shared body: returns false when cuBLASLt has no algorithm (or, for an epilogue, refuses the
// one it offered); throws on any other failure.
bool run_lt(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, const GemmProblem& p,
            double alpha, double beta, const GemmEpilogueArgs& epilogue) {
  const int device = c.device().index;
  octet::cuda::DeviceGuard device_guard(device);
  DeviceContext& ctx = context_for(device);
  cudaStream_t stream = octet::cuda::current_stream(device);

  MatmulDesc desc;
  const cublasOperation_t lt_trans_a = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's A is our b
  const cublasOperation_t lt_trans_b = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLASLt's B is our a
  desc.set(CUBLASLT_MATMUL_DESC_TRANSA, lt_trans_a);
  desc.set(CUBLASLT_MATMUL_DESC_TRANSB, lt_trans_b);
  const cublasLtEpilogue_t lt_epi = lt_epilogue(epilogue.kind);
  desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epi);
  const auto c_type = static_cast<int32_t>(cuda_type(c.dtype()));
  const void* bias_ptr = nullptr;
  if (epilogue.kind != GemmEpilogue::None) {
    bias_ptr = epilogue.bias.data_ptr();
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_ptr);
    desc.set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, c_type);
  }
  // The GELU epilogues' aux matrix has D's layout: our row-major [m, n], cuBLASLt's n × m with
  // leading dimension n, in D's dtype (cuBLASLt's default for a non-FP8 D).
  const void* aux_ptr = nullptr;
  if (epilogue.aux.defined()) {
    aux_ptr = epilogue.aux.data_ptr();
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux_ptr);
    desc.set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t{p.n});
  }

  const Layout b_layout(b.dtype(), trans_b ? p.n : p.k, trans_b ? p.k : p.n, p.batch, p.stride_b);
  const Layout a_layout(a.dtype(), trans_a ? p.k : p.m, trans_a ? p.m : p.k, p.batch, p.stride_a);
  const Layout c_layout(c.dtype(), p.m, p.n, p.batch, p.stride_c);

  const uint32_t align_a = alignment_of(a.data_ptr()), align_b = alignment_of(b.data_ptr());
  // C read from the addend when there is one (D is still c): both matrices' alignment is the least.
  const void* c_read = epilogue.addend.defined() ? epilogue.addend.data_ptr() : c.data_ptr();
  const uint32_t align_c = std::min(alignment_of(c.data_ptr()), alignment_of(c_read));
  const AlgoKey key{device,
                    p.m,
                    p.n,
                    p.k,
                    p.batch,
                    p.stride_b == 0,
                    trans_a,
                    trans_b,
                    static_cast<int64_t>(a.dtype()),
                    static_cast<int64_t>(c.dtype()),
                    static_cast<int64_t>(lt_epi),
                    align_a,
                    align_b,
                    align_c,
                    bias_ptr ? alignment_of(bias_ptr) : 0,
                    aux_ptr ? alignment_of(aux_ptr) : 0,
                    beta != 0.0,
                    epilogue.addend.defined(),
                    autotune_enabled()};

  // alpha and beta are host floats: the scale type of CUBLAS_COMPUTE_32F is f32.
  const float alpha_f = static_cast<float>(alpha), beta_f = static_cast<float>(beta);
  auto run = [&](const cublasLtMatmulAlgo_t& algo, const void* c_in, void* d) {
    return cublasLtMatmul(ctx.handle, desc.desc, &alpha_f, b.data_ptr(), b_layout.layout, a.data_ptr(),
                          a_layout.layout, &beta_f, c_in, c_layout.layout, d, c_layout.layout, &algo, ctx.workspace,
                          kWorkspaceBytes, stream);
  };
  // Autotuning's trials (kernels/autotune.h) write D, which the real run writes again after
  // them, unless D is also the C they read: then in place on a copy of C (TrialCopyOfOutput).
  cublaslt::TrialCopyOfOutput copy(c, p.batch * p.m * p.n, stream);
  auto trial = [&](const cublasLtMatmulAlgo_t& candidate) {
    if (beta_f != 0.f && c_read == c.data_ptr()) {
      void* in_place = copy.get();
      return run(candidate, in_place, in_place);
    }
    return run(candidate, c_read, c.data_ptr());
  };

  // NOT_SUPPORTED means "no algorithm for this configuration". An epilogue that cuBLASLt rejects in
  // any way falls back to the unfused path instead of failing.
  const bool fused = epilogue.kind != GemmEpilogue::None;
  const std::optional<cublasLtMatmulAlgo_t> algo = algo_cache().get(key, [&] {
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;
    std::optional<cublasLtMatmulAlgo_t> found =
        choose_algo(ctx.handle, desc, b_layout, a_layout, c_layout, align_b, align_a, align_c, fused, status, stream,
                    trial, [&] { return problem_text(a, trans_a, b, trans_b, c, p, epilogue.kind); });
    if (!found && fused) note_unfused(a, trans_a, b, trans_b, c, p, epilogue.kind, status);
    return found;
  });
  if (!algo) return false;

  const cublasStatus_t status = run(*algo, c_read, c.data_ptr());
  if ((status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) &&
      epilogue.kind != GemmEpilogue::None) {
    note_unfused(a, trans_a, b, trans_b, c, p, epilogue.kind, status);
    algo_cache().refuse(key);
    return false;
  }
  check_lt(status, "cublasLtMatmul");
  return true;
}

// k = 0: the product is empty and C becomes beta · C.
void scale_output(const Tensor& c, double beta) {
  if (beta == 1.0) return;
  if (beta == 0.0) {
    octet::cuda::DeviceGuard device_guard(c.device().index);
    octet::cuda::check(cudaMemsetAsync(c.data_ptr(), 0, c.nbytes(), octet::cuda::current_stream(c.device().index)),
                       "gemm: cudaMemsetAsync");
    return;
  }
  mul_scalar_(c, beta);
}

}  // namespace

void gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c, const GemmProblem& problem,
          double alpha, double beta) {
  check_operands(a, b, c);
  if (problem.m == 0 || problem.n == 0 || problem.batch == 0) return;
  if (problem.k == 0) return scale_output(c, beta);
  if (run_lt(a, trans_a, b, trans_b, c, problem, alpha, beta, GemmEpilogueArgs{})) return;
  OCTET_FAIL("gemm: cuBLASLt has no algorithm for ", problem_text(a, trans_a, b, trans_b, c, problem, GemmEpilogue::None),
             "; with bf16/f16 operands, sizes whose rows are not 16-byte multiples (K or N not a multiple of 8) can "
             "lack kernels: pad them, or run this GEMM in f32");
}

bool gemm_with_epilogue(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& c,
                        const GemmProblem& problem, double alpha, double beta, const GemmEpilogueArgs& epilogue) {
  check_operands(a, b, c);
  if (epilogue.kind == GemmEpilogue::None) {
    // A plain GEMM reads C from the output itself: an addend here would be dropped without a word.
    OCTET_CHECK(!epilogue.addend.defined(), "gemm: an addend (C apart from the output) goes with the BIAS epilogue, "
                "got it with no epilogue (", epilogue.addend.describe(), "); add it after the GEMM, or pass the bias");
    gemm(a, trans_a, b, trans_b, c, problem, alpha, beta);
    return true;
  }
  // The layout rules the epilogues carry: one matrix (no batch) and a non-empty product.
  if (problem.batch != 1 || problem.m == 0 || problem.n == 0 || problem.k == 0) return false;
  const int64_t length = epilogue.kind == GemmEpilogue::BiasGradFromA ? problem.m : problem.n;
  OCTET_CHECK(epilogue.bias.defined() && epilogue.bias.dtype() == c.dtype() && epilogue.bias.numel() == length &&
                  epilogue.bias.device() == c.device(),
              "gemm: the epilogue's bias vector must have ", length, " elements in ", dtype_name(c.dtype()), " on ",
              c.device().str(), ", got ",
              epilogue.bias.defined() ? epilogue.bias.describe() : std::string("undefined"));
  if (epilogue.addend.defined()) {
    OCTET_CHECK(epilogue.kind == GemmEpilogue::Bias && epilogue.addend.dtype() == c.dtype() &&
                    epilogue.addend.device() == c.device() && epilogue.addend.numel() == problem.m * problem.n,
                "gemm: an addend (C apart from the output) goes with the BIAS epilogue and must be a [", problem.m,
                ", ", problem.n, "] ", dtype_name(c.dtype()), " tensor on ", c.device().str(), ", got ",
                epilogue.addend.describe(), " with epilogue ", epilogue_name(epilogue.kind));
  }
  const bool gelu = epilogue.kind == GemmEpilogue::GeluAuxBias;
  OCTET_CHECK(gelu == epilogue.aux.defined(), "gemm: the ", epilogue_name(epilogue.kind), " epilogue ",
              gelu ? "needs" : "takes no", " aux matrix");
  if (gelu) {
    OCTET_CHECK(epilogue.aux.dtype() == c.dtype() && epilogue.aux.device() == c.device() &&
                    epilogue.aux.numel() == problem.m * problem.n,
                "gemm: the ", epilogue_name(epilogue.kind), " epilogue's aux matrix must be a [",
                problem.m, ", ", problem.n, "] ", dtype_name(c.dtype()), " tensor on ", c.device().str(), ", got ",
                epilogue.aux.describe());
    // cuBLASLt's rules for the aux matrix: its leading dimension a multiple of 8 elements (and, as
    // for every matrix, the pointer's alignment is passed in the algorithm's key). The tanh GELU in
    // 16-bit only: in f32 cuBLASLt's GELU would be less accurate than the unfused kernel's.
    if (problem.n % 8 != 0 || c.dtype() == DType::f32) return false;
  }
  return run_lt(a, trans_a, b, trans_b, c, problem, alpha, beta, epilogue);
}

}  // namespace octet::kernels::cuda
