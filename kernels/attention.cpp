// Entry points for attention, in both layouts (kernels/attention_layout.h): shape checks that name
// the operands, then the backend.
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
#include <initializer_list>
#include <mutex>
#include <string>

#include "core/log.h"
#include "core/op_ledger.h"
#include "kernels/attention_layout.h"
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

// Why the fused cuDNN path is not taken, or "" when it may be: the environment first, then what the
// backend says about the inputs (`backend_reason`, called only when the environment allows).
template <class Reason>
std::string fused_attention_refusal(Reason&& backend_reason) {
  if (env_is_one("OCTET_DISABLE_CUDNN_ATTENTION")) return "OCTET_DISABLE_CUDNN_ATTENTION=1 forces the unfused path";
  return backend_reason();
}

// "9.19.0 (cudnnGetVersion() = 91900)": cuDNN 9 numbers its releases major·10000 + minor·100 + patch.
std::string cudnn_version_text() {
  const size_t v = cuda::cudnn_version();
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100) +
         " (cudnnGetVersion() = " + std::to_string(v) + ")";
}

// The fixed start "attention: no fused cuDNN plan" is what scripts grep logs for: keep it.
// `operands` describes the inputs ("q: ..., k: ..., v: ..." or "qkv: ...").
std::string no_fused_plan_text(const char* op, const std::string& operands, DType dtype, const std::string& why) {
  return std::string("attention: no fused cuDNN plan for ") + op + " (" + operands + ", dtype " + dtype_name(dtype) +
         ", cuDNN " + cudnn_version_text() + "): " + why;
}

// Called where the unfused GPU kernels are about to run: throws under OCTET_REQUIRE_FUSED_ATTENTION=1,
// else warns the first time in the process, and counts the call.
void take_unfused_path(const char* op, const std::string& operands, DType dtype, const std::string& why,
                       std::atomic<int64_t>& counter) {
  if (env_is_one("OCTET_REQUIRE_FUSED_ATTENTION")) {
    OCTET_FAIL(no_fused_plan_text(op, operands, dtype, why),
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
                  no_fused_plan_text(op, operands, dtype, why));
  });
  counter.fetch_add(1, std::memory_order_relaxed);
}

AttentionOutput attention_forward_cuda(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward";
  std::string why = fused_attention_refusal([&] { return cuda::cudnn_attention_unsupported_reason(q, k, v); });
  if (why.empty()) {
    if (auto fused = cuda::cudnn_attention_forward(q, k, v, scale, why)) {
      path_counters().fused_forward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, describe_qkv(q, k, v), q.dtype(), why, path_counters().unfused_forward);
  return cuda::unfused_attention_forward(q, k, v, scale);
}

AttentionGrads attention_backward_cuda(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward";
  // Both GPU paths read dout and out in q's dtype (a no-op in training, where they already are).
  const Tensor dout_q = dout.detach().to(q.dtype()), out_q = out.detach().to(q.dtype());
  std::string why = fused_attention_refusal([&] { return cuda::cudnn_attention_unsupported_reason(q, k, v); });
  if (why.empty()) {
    if (auto fused = cuda::cudnn_attention_backward(dout_q, q, k, v, out_q, lse, scale, why)) {
      path_counters().fused_backward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, describe_qkv(q, k, v), q.dtype(), why, path_counters().unfused_backward);
  return cuda::unfused_attention_backward(dout_q, q, k, v, out_q, lse, scale);
}


AttentionOutput packed_attention_forward_cuda(const Tensor& qkv, double scale) {
  constexpr const char* op = "packed_attention_forward";
  std::string why = fused_attention_refusal([&] { return cuda::cudnn_packed_attention_unsupported_reason(qkv); });
  if (why.empty()) {
    if (auto fused = cuda::cudnn_packed_attention_forward(qkv, scale, why)) {
      path_counters().fused_forward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, "qkv: " + qkv.describe(), qkv.dtype(), why, path_counters().unfused_forward);
  return cuda::unfused_packed_attention_forward(qkv, scale);
}

Tensor packed_attention_backward_cuda(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                      double scale) {
  constexpr const char* op = "packed_attention_backward";
  const Tensor dout_q = dout.detach().to(qkv.dtype()), out_q = out.detach().to(qkv.dtype());
  std::string why = fused_attention_refusal([&] { return cuda::cudnn_packed_attention_unsupported_reason(qkv); });
  if (why.empty()) {
    if (auto fused = cuda::cudnn_packed_attention_backward(dout_q, qkv, out_q, lse, scale, why)) {
      path_counters().fused_backward.fetch_add(1, std::memory_order_relaxed);
      return *fused;
    }
  }
  take_unfused_path(op, "qkv: " + qkv.describe(), qkv.dtype(), why, path_counters().unfused_backward);
  return cuda::unfused_packed_attention_backward(dout_q, qkv, out_q, lse, scale);
}

// Matrix-product FLOPs: the forward's q·kᵀ and P·v; the backward's five products (q·kᵀ again, to
// rebuild P, then dv, dP, dq and dk), 2 per multiply-add.
double forward_flops(const AttentionDims& z) { return 4.0 * static_cast<double>(z.b * z.h) * z.s * z.sk * z.d; }
double backward_flops(const AttentionDims& z) { return 2.5 * forward_flops(z); }
int64_t lse_bytes(const AttentionDims& z) { return z.b * z.h * z.s * 4; }

// The [B, H, S, D] sizes of a packed qkv [B, S, 3, H, D].
AttentionDims packed_dims(const Tensor& qkv) {
  return {qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4)};
}

void check_packed_qkv(const char* op, const Tensor& qkv) {
  check_defined(op, {&qkv});
  check_floating(op, qkv);
  OCTET_CHECK(qkv.dim() == 5 && qkv.size(2) == 3, op, ": qkv must be [B, S, 3, H, D], the qkv projection's output [B, S, 3·H·D] "
              "reshaped with its heads spelled out; got ", qkv.describe());
  OCTET_CHECK(qkv.size(3) >= 1 && qkv.size(4) >= 1, op, ": qkv ", qkv.describe(), " needs at least one head and a nonzero head dim");
}

// A bf16 tensor's elements, for the CPU's bf16 attention (kernels/cpu/attention_cpu.h).
const bfloat16* bf16_data(const Tensor& t) { return static_cast<const bfloat16*>(t.data_ptr()); }
bfloat16* bf16_data(Tensor& t) { return static_cast<bfloat16*>(t.data_ptr()); }
bool all_bf16(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->dtype() != DType::bf16) return false;
  }
  return true;
}

}  // namespace

AttentionPathCounts attention_path_counts() {
  const PathCounters& c = path_counters();
  return {c.fused_forward.load(), c.fused_backward.load(), c.unfused_forward.load(), c.unfused_backward.load()};
}

AttentionOutput attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale) {
  constexpr const char* op = "attention_forward";
  check_qkv(op, q, k, v);
  const AttentionDims dims{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read({&q, &k, &v}).write(q).write_bytes(lse_bytes(dims)).flops(forward_flops(dims));
  if (q.is_cuda()) return attention_forward_cuda(q, k, v, scale);
  check_cpu(op, {&q, &k, &v});
  const int64_t b = q.size(0), h = q.size(1), s = q.size(2), d = q.size(3), sk = k.size(2);
  const DType ct = compute_dtype(q.dtype());
  if (all_bf16({&q, &k, &v}) && q.numel() > 0) {  // widened a head at a time
    const AttentionDims z{b, h, s, sk, d};
    const HeadStrides qs = query_strides(AttentionLayout::kBhsd, z), ks = key_strides(AttentionLayout::kBhsd, z);
    Tensor out = empty(q.shape(), DType::bf16, q.device()), lse = empty({b, h, s}, ct, q.device());
    if (cpu::attention_forward_bf16({bf16_data(q), qs}, {bf16_data(k), ks}, {bf16_data(v), ks}, {bf16_data(out), qs},
                                    lse.data<float>(), z, static_cast<float>(scale))) {
      return {out, lse};
    }
  }
  Tensor out = empty(q.shape(), ct, q.device());
  Tensor lse = empty({b, h, s}, ct, q.device());
  if (out.numel() > 0) {
    const Tensor qc = to_compute(q), kc = to_compute(k), vc = to_compute(v);
    const AttentionDims z{b, h, s, sk, d};
    const HeadStrides qs = query_strides(AttentionLayout::kBhsd, z), ks = key_strides(AttentionLayout::kBhsd, z);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_forward<T>({qc.data<T>(), qs}, {kc.data<T>(), ks}, {vc.data<T>(), ks}, {out.data<T>(), qs},
                                lse.data<T>(), z, static_cast<T>(scale));
    });
  }
  return {out.to(q.dtype()), lse};
}

AttentionGrads attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, double scale) {
  constexpr const char* op = "attention_backward";
  check_qkv(op, q, k, v);
  check_defined(op, {&dout, &out, &lse});
  const AttentionDims dims{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)};
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read({&dout, &q, &k, &v, &out, &lse})
      .write(q)
      .write(k)
      .write(v)
      .flops(backward_flops(dims));
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
  if (all_bf16({&q, &k, &v, &dout, &out}) && q.numel() > 0) {  // widened a head at a time
    const AttentionDims z{b, h, s, sk, d};
    const HeadStrides qs = query_strides(AttentionLayout::kBhsd, z), ks = key_strides(AttentionLayout::kBhsd, z);
    Tensor dq = empty(q.shape(), DType::bf16, q.device()), dk = empty(k.shape(), DType::bf16, q.device());
    Tensor dv = empty(v.shape(), DType::bf16, q.device());
    if (cpu::attention_backward_bf16({bf16_data(dout), qs}, {bf16_data(q), qs}, {bf16_data(k), ks},
                                     {bf16_data(v), ks}, {bf16_data(out), qs}, lse.data<float>(), {bf16_data(dq), qs},
                                     {bf16_data(dk), ks}, {bf16_data(dv), ks}, z, static_cast<float>(scale))) {
      return {dq, dk, dv};
    }
  }
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
    const AttentionDims z{b, h, s, sk, d};
    const HeadStrides qs = query_strides(AttentionLayout::kBhsd, z), ks = key_strides(AttentionLayout::kBhsd, z);
    with_compute_type(ct, [&]<class T>() {
      cpu::attention_backward<T>({doc.data<T>(), qs}, {qc.data<T>(), qs}, {kc.data<T>(), ks}, {vc.data<T>(), ks},
                                 {oc.data<T>(), qs}, lse.data<T>(), {dq.data<T>(), qs}, {dk.data<T>(), ks},
                                 {dv.data<T>(), ks}, z, static_cast<T>(scale));
    });
  }
  return {dq.to(q.dtype()), dk.to(q.dtype()), dv.to(q.dtype())};
}

AttentionOutput packed_attention_forward(const Tensor& qkv, double scale) {
  constexpr const char* op = "packed_attention_forward";
  check_packed_qkv(op, qkv);
  const AttentionDims dims = packed_dims(qkv);
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read(qkv)
      .write_bytes(qkv.numel() / 3 * static_cast<int64_t>(qkv.element_size()) + lse_bytes(dims))
      .flops(forward_flops(dims));
  if (qkv.is_cuda()) return packed_attention_forward_cuda(qkv, scale);
  check_cpu(op, {&qkv});
  const AttentionDims z = packed_dims(qkv);
  const DType ct = compute_dtype(qkv.dtype());
  if (qkv.dtype() == DType::bf16 && qkv.numel() > 0) {  // widened a head at a time
    const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
    Tensor out = empty({z.b, z.s, z.h, z.d}, DType::bf16, qkv.device()), lse = empty({z.b, z.h, z.s}, ct, qkv.device());
    const bfloat16* base = bf16_data(qkv);
    if (cpu::attention_forward_bf16({base, qs}, {base + packed_k_offset(z), qs}, {base + packed_v_offset(z), qs},
                                    {bf16_data(out), output_strides(AttentionLayout::kPacked, z)}, lse.data<float>(), z,
                                    static_cast<float>(scale))) {
      return {out, lse};
    }
  }
  Tensor out = empty({z.b, z.s, z.h, z.d}, ct, qkv.device());
  Tensor lse = empty({z.b, z.h, z.s}, ct, qkv.device());
  if (out.numel() > 0) {
    const Tensor c = to_compute(qkv);
    const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
    with_compute_type(ct, [&]<class T>() {
      const T* base = c.data<T>();
      cpu::attention_forward<T>({base, qs}, {base + packed_k_offset(z), qs}, {base + packed_v_offset(z), qs},
                                {out.data<T>(), output_strides(AttentionLayout::kPacked, z)}, lse.data<T>(), z,
                                static_cast<T>(scale));
    });
  }
  return {out.to(qkv.dtype()), lse};
}

Tensor packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 double scale) {
  constexpr const char* op = "packed_attention_backward";
  check_packed_qkv(op, qkv);
  check_defined(op, {&dout, &out, &lse});
  check_same_device(op, {&qkv, &dout, &out, &lse});
  check_floating(op, dout);
  check_floating(op, out);
  const AttentionDims z = packed_dims(qkv);
  LedgerOp ledger(op, OpClass::kMatmul);
  ledger.read({&dout, &qkv, &out, &lse}).write(qkv).flops(backward_flops(z));
  const Shape out_shape{z.b, z.s, z.h, z.d};
  OCTET_CHECK(dout.shape() == out_shape && out.shape() == out_shape, op, ": dout and out must be [B, S, H, D] = ",
              out_shape, " for qkv ", qkv.describe(), " (dout: ", dout.describe(), ", out: ", out.describe(), ")");
  const DType ct = qkv.is_cuda() ? DType::f32 : compute_dtype(qkv.dtype());
  OCTET_CHECK(lse.shape() == Shape({z.b, z.h, z.s}) && lse.dtype() == ct, op, ": lse ", lse.describe(), " should be ",
              dtype_name(ct), Shape({z.b, z.h, z.s}), ", as packed_attention_forward returns it (qkv: ", qkv.describe(),
              ")");
  if (qkv.is_cuda()) return packed_attention_backward_cuda(dout, qkv, out, lse, scale);
  check_cpu(op, {&qkv, &dout, &out, &lse});
  if (all_bf16({&qkv, &dout, &out}) && qkv.numel() > 0) {  // widened a head at a time
    const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
    const HeadStrides os = output_strides(AttentionLayout::kPacked, z);
    Tensor dqkv = empty(qkv.shape(), DType::bf16, qkv.device());
    const bfloat16* base = bf16_data(qkv);
    bfloat16* grad = bf16_data(dqkv);
    if (cpu::attention_backward_bf16({bf16_data(dout), os}, {base, qs}, {base + packed_k_offset(z), qs},
                                     {base + packed_v_offset(z), qs}, {bf16_data(out), os}, lse.data<float>(),
                                     {grad, qs}, {grad + packed_k_offset(z), qs}, {grad + packed_v_offset(z), qs}, z,
                                     static_cast<float>(scale))) {
      return dqkv;
    }
  }
  Tensor dqkv = empty(qkv.shape(), ct, qkv.device());
  if (dqkv.numel() > 0) {
    // Every element of dqkv is some head's row of dq, dk or dv, so all of it is written.
    const Tensor c = to_compute(qkv), doc = dout.detach().to(ct), oc = out.detach().to(ct);
    const HeadStrides qs = query_strides(AttentionLayout::kPacked, z);
    const HeadStrides os = output_strides(AttentionLayout::kPacked, z);
    with_compute_type(ct, [&]<class T>() {
      const T* base = c.data<T>();
      T* grad = dqkv.data<T>();
      cpu::attention_backward<T>({doc.data<T>(), os}, {base, qs}, {base + packed_k_offset(z), qs},
                                 {base + packed_v_offset(z), qs}, {oc.data<T>(), os}, lse.data<T>(), {grad, qs},
                                 {grad + packed_k_offset(z), qs}, {grad + packed_v_offset(z), qs}, z,
                                 static_cast<T>(scale));
    });
  }
  return dqkv.to(qkv.dtype());
}

}  // namespace octet::kernels
