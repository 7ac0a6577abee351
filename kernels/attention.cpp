// Entry points for attention: shape checks that name q, k and v, then the backend.
//   CPU: unfused, widening low-precision inputs to the compute type (f32, or f64 for f64) and
//        rounding the results back to q's dtype once.
//   CUDA: cuDNN's fused kernels when they take the inputs (bf16/f16, head dim <= 128 and a multiple
//        of 8) and cuDNN builds a plan for the shape; otherwise the unfused GPU kernels, with one
//        warning per process ("attention: no fused cuDNN plan ..."), or an error under
//        OCTET_REQUIRE_FUSED_ATTENTION=1. OCTET_DISABLE_CUDNN_ATTENTION=1 forces the unfused path
//        (tests, A/B timing). Every GPU call is counted by the path it took (attention_path_counts).
#include "kernels/attention.h"

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/log.h"
#include "kernels/common.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cuda/attention_cuda.h"

namespace octet::kernels {

namespace {

struct PathCounters {
  std::atomic<int64_t> fused_forward{0}, fused_backward{0}, unfused_forward{0}, unfused_backward{0};
};
PathCounters& path_counters() {
  static PathCounters counters;
  return counters;
}

std::string describe_qkv(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "q: " + q.describe() + ", k: " + k.describe() + ", v: " + v.describe();
}

void check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  check_defined(op, {&q, &k, &v});
  check_same_device(op, {&q, &k, &v});
  check_same_dtype(op, {&q, &k, &v});
  check_floating(op, q);
  OCTET_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, op, ": q, k and v must be [B, H, S, D] (",
              describe_qkv(q, k, v), ")");
  OCTET_CHECK(k.shape() == v.shape(), op, ": k and v must have the same shape [B, H, Sk, D] (", describe_qkv(q, k, v),
              ")");
  OCTET_CHECK(q.size(0) == k.size(0) && q.size(1) == k.size(1) && q.size(3) == k.size(3), op,
              ": q and k must agree on batch, heads and head dim (", describe_qkv(q, k, v), ")");
  OCTET_CHECK(k.size(2) >= 1 && q.size(3) >= 1, op, ": needs at least one key and a nonzero head dim (",
              describe_qkv(q, k, v), ")");
}

bool env_is_one(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && std::string(value) == "1";
}

// Why the fused cuDNN path is not taken for these inputs, or "" when it may be.
std::string fused_attention_refusal(const Tensor& q, const Tensor& k, const Tensor& v) {
  if (env_is_one("OCTET_DISABLE_CUDNN_ATTENTION")) return "OCTET_DISABLE_CUDNN_ATTENTION=1 forces the unfused path";
  return cuda::cudnn_attention_unsupported_reason(q, k, v);
}

// "9.19.0 (cudnnGetVersion() = 91900)": cuDNN 9 numbers its releases major·10000 + minor·100 + patch.
std::string cudnn_version_text() {
  const size_t v = cuda::cudnn_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " (cudnnGetVersion() = " + std::to_string(v) + ")";
}

// The fixed start "attention: no fused cuDNN plan" is what scripts grep logs for: keep it.
std::string no_fused_plan_text(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                               const std::string& why) {
  return std::string("attention: no fused cuDNN plan for ") + op + " (" + describe_qkv(q, k, v) + ", dtype " +
         dtype_name(q.dtype()) + ", cuDNN " + cudnn_version_text() + "): " + why;
}

// Called where the unfused GPU kernels are about to run: throws under OCTET_REQUIRE_FUSED_ATTENTION=1,
// else warns the first time in the process, and counts the call.
void take_unfused_path(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const std::string& why,
                       std::atomic<int64_t>& counter) {
  if (env_is_one("OCTET_REQUIRE_FUSED_ATTENTION")) {
    OCTET_FAIL(no_fused_plan_text(op, q, k, v, why),
               ". OCTET_REQUIRE_FUSED_ATTENTION=1 forbids the unfused GPU kernels. cuDNN's fused attention needs "
               "bf16 or f16 q, k and v, a head dim up to 128 that is a multiple of 8, 16-byte aligned tensors, "
               "OCTET_DISABLE_CUDNN_ATTENTION unset, and a cuDNN with an engine for this graph on this GPU (9.10.2 or "
               "newer; 9.15.1 or newer for the backward when Sk is not a multiple of 128): change what the reason "
               "names, or unset OCTET_REQUIRE_FUSED_ATTENTION to accept the unfused kernels");
  }
  static std::once_flag warned;
  std::call_once(warned, [&] {
    logging::warn("{}; running the unfused GPU kernels instead (slower, and more memory for long sequences). "
                  "Logged once per process; OCTET_REQUIRE_FUSED_ATTENTION=1 makes it an error",
                  no_fused_plan_text(op, q, k, v, why));
  });
  counter.fetch_add(1, std::memory_order_relaxed);
}

AttentionOutput attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward";
  std::string why = fused_attention_refusal(q, k, v);
  if (why.empty()) {
    if (auto fused = cuda::cudnn_attention_forward(q, k, v, scale, why)) {
      path_counters().fused_forward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, q, k, v, why, path_counters().unfused_forward);
  return cuda::unfused_attention_forward(q, k, v, scale);
}

AttentionGrads attention_backward_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward";
  // Both GPU paths read dout and out in q's dtype (a no-op in training, where they already are).
  const Tensor dout_q = dout.detach().to(q.dtype()), out_q = out.detach().to(q.dtype());
  std::string why = fused_attention_refusal(q, k, v);
  if (why.empty()) {
    if (auto fused = cuda::cudnn_attention_backward(dout_q, q, k, v, out_q, lse, scale, why)) {
      path_counters().fused_backward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, q, k, v, why, path_counters().unfused_backward);
  return cuda::unfused_attention_backward(dout_q, q, k, v, out_q, lse, scale);
}

}  // namespace

AttentionPathCounts attention_path_counts() {
  const PathCounters& c = path_counters();
  return {c.fused_forward.load(), c.fused_backward.load(), c.unfused_forward.load(), c.unfused_backward.load()};
}

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward";
  check_qkv(op, q, k, v);
  if (q.is_cuda()) return attention_forward_cuda(q, k, v, scale);
  check_cpu(op, {&q, &k, &v});
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  const DType ct = compute_dtype(q.dtype());
  Tensor out = empty(q.shape(), ct, q.device());
  Tensor lse = empty({b, h, s}, ct, q.device());
  if (out.numel() > 0) {
    const Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_forward<T>(qc.data<T>(), kc.data<T>(), vc.data<T>(), out.data<T>(), lse.data<T>(), b * h, s, sk, d,
                                static_cast<T>(scale));
    });
  }
  return {out.to(q.dtype()), lse};
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward";
  check_qkv(op, q, k, v);
  check_defined(op, {&dout, &out, &lse});
  check_same_device(op, {&q, &dout, &out, &lse});
  OCTET_CHECK(dout.shape() == q.shape() && out.shape() == q.shape(), op,
              ": dout and out must have q's shape (dout: ", dout.describe(), ", out: ", out.describe(), ", ",
              describe_qkv(q, k, v), ")");
  check_floating(op, dout);
  check_floating(op, out);
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  // The GPU keeps lse in f32 whatever q's dtype; the CPU in its compute type.
  const DType ct = q.is_cuda() ? DType::f32 : compute_dtype(q.dtype());
  OCTET_CHECK(lse.shape() == Shape({b, h, s}) && lse.dtype() == ct, op, ": lse ", lse.describe(), " should be ",
              dtype_name(ct), Shape({b, h, s}), ", as attention_forward returns it (q: ", q.describe(), ")");
  if (q.is_cuda()) return attention_backward_cuda(dout, q, k, v, out, lse, scale);
  check_cpu(op, {&q, &k, &v, &dout, &out, &lse});
  Tensor dq = empty(q.shape(), ct, q.device());
  Tensor dk = empty(k.shape(), ct, q.device());
  Tensor dv = empty(v.shape(), ct, q.device());
  if (q.numel() == 0) {  // no queries: nothing flows to k and v
    dk.zero_();
    dv.zero_();
  } else {
    // dout and out are widened exactly like the inputs; out is the rounded forward output, so δ uses
    // what the forward actually returned.
    const Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v);
    const Tensor doc = dout.detach().to(ct), oc = out.detach().to(ct);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_backward<T>(doc.data<T>(), qc.data<T>(), kc.data<T>(), vc.data<T>(), oc.data<T>(), lse.data<T>(),
                                 dq.data<T>(), dk.data<T>(), dv.data<T>(), b * h, s, sk, d, static_cast<T>(scale));
    });
  }
  return {dq.to(q.dtype()), dk.to(q.dtype()), dv.to(q.dtype())};
}

}  // namespace octet::kernels
