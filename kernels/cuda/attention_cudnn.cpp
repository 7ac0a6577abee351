// cuDNN fused scaled-dot-product attention through the cuDNN graph (backend) API.
//
// We describe attention to cuDNN as a graph of small operations (matmuls, pointwise ops,
// reductions) and cuDNN's heuristics hand back a fused flash-attention engine that runs the whole
// graph in one kernel, never writing the S×Sk score matrix to memory. The graphs are the ones
// NVIDIA's cudnn-frontend builds for its "composite" SDPA nodes on cuDNN 9 (before 9.21, which has
// a single softmax operation); cuDNN's engines are matched against exactly these patterns, so the
// operations, data types and layouts below follow the frontend's choices, including for tensors
// that never reach memory (virtual tensors).
//
// Forward, per head, with s the scale (a by-value f32 operand):
//   X = q·kᵀ (f32)    X' = s·X    m = rowmax(X')    E = exp(X' − m)    z = rowsum(E)
//   lse = m + log z   (the "stats" output, f32 [B, H, S, 1]: natural-log log-sum-exp)
//   P = E / z (bf16/f16, as the frontend types it)    out = P·v
// Backward, given dout, with δ = rowsum(dout ⊙ out):
//   P = exp(s·q·kᵀ − lse)    dv = Pᵀ·dout    dS = s · P ⊙ (dout·vᵀ − δ)
//   dk = dSᵀ·q    dq = dS·k (accumulated in an f32 buffer, then converted)
// K enters both graphs transposed (Kᵀ [B, H, D, Sk] as a strided view of K) because cuDNN's
// matmul takes its operands as [.., M, K] and [.., K, N]; the transposes of P, dS and Kᵀ inside
// the backward graph are "reshape" operations with swapped strides.
//
// q, k, v, out and their gradients are described to cuDNN with the strides of their memory, so the
// same graphs serve both layouts of kernels/attention_layout.h: separate [B, H, S, D] tensors, and
// q, k and v read straight out of the packed qkv [B, S, 3, H, D] (out [B, S, H, D], dq, dk and dv
// written back into one packed gradient), which is how the model runs.
//
// Plans are built once per (device, layout, B, H, S, Sk, D, dtype, scale, direction) and cached;
// each call then only fills a variant pack (the data pointers) and executes on the device's current
// stream. With autotuning on (kernels/autotune.h), the first call of a key times cuDNN's candidate
// engine configurations on its own tensors and caches the fastest.
#include <cudnn.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/cuda_stream.h"
#include "core/error.h"
#include "kernels/attention_layout.h"
#include "kernels/autotune.h"
#include "kernels/cuda/attention_cuda.h"
#include "kernels/cuda/cudnn_graph.h"

namespace octet::kernels::cuda {

namespace {

using namespace cudnn;  // the graph helpers (kernels/cuda/cudnn_graph.h)

// ---- handles and the plan cache -------------------------------------------------------------------------

struct PlanKey {
  int device;
  AttentionLayout layout;
  int64_t b, h, s, sk, d;
  DType dtype;
  double scale;
  bool backward;
  bool autotune;  // the plan was timed among cuDNN's candidates (kernels/autotune.h)
  auto tie() const { return std::tie(device, layout, b, h, s, sk, d, dtype, scale, backward, autotune); }
  bool operator<(const PlanKey& other) const { return tie() < other.tie(); }
};

struct CacheEntry {
  std::unique_ptr<Plan> plan;  // null: cuDNN built none for this key
  std::string why_not;
};

// One mutex guards the handles, the cache and each execution: cudnnSetStream followed by an execute
// on a shared handle must not interleave with another thread's.
std::mutex& cudnn_mutex() {
  static std::mutex m;
  return m;
}
std::map<PlanKey, CacheEntry>& plan_cache() {
  static auto* cache = new std::map<PlanKey, CacheEntry>();  // never destroyed: see handle_for
  return *cache;
}

// The device's cuDNN handle, created on first use. Handles and plans live until the process ends
// on purpose: destroying them from static destructors would race the CUDA runtime's own teardown.
cudnnHandle_t handle_for(int device) {
  static auto* handles = new std::map<int, cudnnHandle_t>();
  auto it = handles->find(device);
  if (it != handles->end()) return it->second;
  cudnnHandle_t handle = nullptr;
  check(cudnnCreate(&handle), "cudnnCreate", "the handle of cuda:" + std::to_string(device));
  handles->emplace(device, handle);
  return handle;
}

cudnnDataType_t cudnn_dtype(DType dtype) {
  switch (dtype) {
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    case DType::f16: return CUDNN_DATA_HALF;
    default: OCTET_FAIL("cuDNN attention: no fused kernel for ", dtype_name(dtype), " (bf16 or f16 only)");
  }
}

// Looks the plan up, building and caching it (or its absence) on the first call; while autotuning,
// `trial` runs a candidate on the call's own tensors (build_plan). Caller holds the mutex.
template <class BuildGraph>
const Plan* find_plan(const PlanKey& key, cudnnHandle_t handle, BuildGraph&& build_graph, const PlanTrial& trial,
                      std::string& why_not) {
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    CacheEntry entry;
    GraphBuilder builder;
    bool described = false;
    try {
      build_graph(builder);
      described = true;
    } catch (const Error& e) {  // cuDNN refused a tensor or an operation of the graph
      entry.why_not = e.what();
    }
    if (described) {
      const auto what = [&] {
        return std::string(key.backward ? "attention backward" : "attention forward") + " B=" + std::to_string(key.b) +
               " H=" + std::to_string(key.h) + " S=" + std::to_string(key.s) + " Sk=" + std::to_string(key.sk) +
               " D=" + std::to_string(key.d) + " " + dtype_name(key.dtype);
      };
      // Outside the try: build_plan reports cuDNN's refusals as a null plan with the reason, and
      // throws only for an error while autotuning times the candidates (the GPU's, not a refusal),
      // which must reach the caller with nothing cached, so that the next call tries again.
      entry.plan = build_plan(handle, builder, entry.why_not, octet::cuda::current_stream(key.device), trial, what);
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  if (it->second.plan == nullptr) why_not = it->second.why_not;
  return it->second.plan.get();
}

// uids of the tensors a variant pack names (virtual tensors take uids from 1000 up).
enum Uid : int64_t {
  kQ = 1, kK, kV, kScale, kOut, kStats, kDout, kDq, kDk, kDv, kOne, kSoftmaxSum, kDqAccum
};

using Sizes = AttentionDims;
Sizes sizes_of(const Tensor& q, const Tensor& k) { return {q.size(0), q.size(1), q.size(2), k.size(2), q.size(3)}; }
Sizes packed_sizes_of(const Tensor& qkv) { return {qkv.size(0), qkv.size(3), qkv.size(1), qkv.size(1), qkv.size(4)}; }

Dims row_major(const HeadStrides& st) { return {st.batch, st.head, st.row, 1}; }

// Layouts shared by both graphs. q, k, v, out and their gradients are [B, H, S, D] described with
// the strides of their memory in `layout`; Kᵀ (and Vᵀ) are the same memory with the last two dims
// and strides swapped. The dQ accumulator is the engine's own contiguous [B, H, S, D] buffer.
struct Layouts {
  Dims q, q_strides, kv, kv_strides, kt, kt_strides, scores, scores_strides, scores_t_strides, row, row_strides;
  Dims scores_t, o_strides, accum_strides;
};
Layouts layouts_of(const Sizes& z, AttentionLayout layout) {
  Layouts l;
  const HeadStrides ks = key_strides(layout, z);
  l.q = {z.b, z.h, z.s, z.d};
  l.q_strides = row_major(query_strides(layout, z));
  l.o_strides = row_major(output_strides(layout, z));
  l.accum_strides = contiguous_strides(l.q);
  l.kv = {z.b, z.h, z.sk, z.d};
  l.kv_strides = row_major(ks);
  l.kt = {z.b, z.h, z.d, z.sk};
  l.kt_strides = {ks.batch, ks.head, 1, ks.row};
  l.scores = {z.b, z.h, z.s, z.sk};
  l.scores_strides = contiguous_strides(l.scores);
  l.scores_t = {z.b, z.h, z.sk, z.s};  // Pᵀ, dSᵀ: the score matrix read column-major
  l.scores_t_strides = {l.scores_strides[0], l.scores_strides[1], 1, z.sk};
  l.row = {z.b, z.h, z.s, 1};  // per-row statistics
  l.row_strides = {z.h * z.s, z.s, 1, 1};
  return l;
}

void build_forward_graph(GraphBuilder& g, const Sizes& z, AttentionLayout layout, cudnnDataType_t io) {
  const Layouts l = layouts_of(z, layout);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const TensorRef q = g.tensor("Q", kQ, l.q, l.q_strides, io);
  const TensorRef kt = g.tensor("K^T", kK, l.kt, l.kt_strides, io);
  const TensorRef v = g.tensor("V", kV, l.kv, l.kv_strides, io);
  const TensorRef scale = g.scalar("scale", kScale);
  const TensorRef out = g.tensor("O", kOut, l.q, l.o_strides, io);
  const TensorRef stats = g.tensor("stats", kStats, l.row, l.row_strides, f32);

  const TensorRef x = g.virtual_tensor("Q·K^T", l.scores, l.scores_strides, f32);
  g.matmul("Q·K^T", q, kt, x);
  const TensorRef scaled = g.virtual_tensor("scale·Q·K^T", l.scores, l.scores_strides, f32);
  g.pointwise("attention scale", CUDNN_POINTWISE_MUL, x, scale, scaled);
  const TensorRef row_max = g.virtual_tensor("row max", l.row, l.row_strides, f32);
  g.reduction("row max", CUDNN_REDUCE_TENSOR_MAX, scaled, row_max);
  const TensorRef shifted = g.virtual_tensor("X - max", l.scores, l.scores_strides, f32);
  g.pointwise("subtract max", CUDNN_POINTWISE_SUB, scaled, row_max, shifted);
  const TensorRef exps = g.virtual_tensor("exp(X - max)", l.scores, l.scores_strides, f32);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, nullptr, exps);
  const TensorRef row_sum = g.virtual_tensor("row sum", l.row, l.row_strides, f32);
  g.reduction("row sum", CUDNN_REDUCE_TENSOR_ADD, exps, row_sum);
  const TensorRef log_sum = g.virtual_tensor("log row sum", l.row, l.row_strides, f32);
  g.pointwise("log", CUDNN_POINTWISE_LOG, row_sum, nullptr, log_sum);
  g.pointwise("stats = max + log sum", CUDNN_POINTWISE_ADD, row_max, log_sum, stats);
  // The probabilities enter the second matmul in the I/O type, as the frontend types them.
  const TensorRef p = g.virtual_tensor("P", l.scores, l.scores_strides, io);
  g.pointwise("normalize", CUDNN_POINTWISE_DIV, exps, row_sum, p);
  g.matmul("P·V", p, v, out);
}

void build_backward_graph(GraphBuilder& g, const Sizes& z, AttentionLayout layout, cudnnDataType_t io) {
  const Layouts l = layouts_of(z, layout);
  const cudnnDataType_t f32 = CUDNN_DATA_FLOAT;
  const TensorRef q = g.tensor("Q", kQ, l.q, l.q_strides, io);
  const TensorRef kt = g.tensor("K^T", kK, l.kt, l.kt_strides, io);
  const TensorRef vt = g.tensor("V^T", kV, l.kt, l.kt_strides, io);
  const TensorRef out = g.tensor("O", kOut, l.q, l.o_strides, io);
  const TensorRef dout = g.tensor("dO", kDout, l.q, l.o_strides, io);
  const TensorRef stats = g.tensor("stats", kStats, l.row, l.row_strides, f32);
  const TensorRef scale = g.scalar("scale", kScale);
  const TensorRef one = g.scalar("one", kOne);
  const TensorRef dq = g.tensor("dQ", kDq, l.q, l.q_strides, io);
  const TensorRef dk = g.tensor("dK", kDk, l.kv, l.kv_strides, io);
  const TensorRef dv = g.tensor("dV", kDv, l.kv, l.kv_strides, io);
  // Two f32 buffers in memory that the engine fills itself: δ per row and the dQ accumulator.
  const TensorRef softmax_sum = g.tensor("softmax sum", kSoftmaxSum, l.row, l.row_strides, f32);
  const TensorRef dq_accum = g.accumulator("dQ accumulator", kDqAccum, l.q, l.accum_strides);

  // δ = rowsum(dO ⊙ O). The product's strides are the frontend's (only the dims of a virtual
  // tensor that is reduced right away matter).
  const Dims product_strides = {z.h * z.s * z.d, z.s * z.d, z.h * z.d, 1};
  const TensorRef dout_out = g.virtual_tensor("dO*O", l.q, product_strides, f32);
  g.pointwise("dO*O", CUDNN_POINTWISE_MUL, dout, out, dout_out);
  const TensorRef delta = g.virtual_tensor("rowsum(dO*O)", l.row, l.row_strides, f32);
  g.reduction("rowsum(dO*O)", CUDNN_REDUCE_TENSOR_ADD, dout_out, delta);
  g.pointwise("softmax sum = delta * 1", CUDNN_POINTWISE_MUL, delta, one, softmax_sum);

  // P = exp(scale·Q·Kᵀ − lse); dV = Pᵀ·dO
  const TensorRef x = g.virtual_tensor("Q·K^T", l.scores, l.scores_strides, f32);
  g.matmul("Q·K^T", q, kt, x);
  const TensorRef scaled = g.virtual_tensor("scale·Q·K^T", l.scores, l.scores_strides, f32);
  g.pointwise("attention scale", CUDNN_POINTWISE_MUL, x, scale, scaled);
  const TensorRef shifted = g.virtual_tensor("X - stats", l.scores, l.scores_strides, f32);
  g.pointwise("subtract stats", CUDNN_POINTWISE_SUB, scaled, stats, shifted);
  const TensorRef p = g.virtual_tensor("P", l.scores, l.scores_strides, f32);
  g.pointwise("exp", CUDNN_POINTWISE_EXP, shifted, nullptr, p);
  const TensorRef pt = g.virtual_tensor("P^T", l.scores_t, l.scores_t_strides, io);
  g.reshape("P^T", p, pt);
  g.matmul("P^T·dO", pt, dout, dv);

  // dS = scale · P ⊙ (dO·Vᵀ − δ); dK = dSᵀ·Q
  const TensorRef dp = g.virtual_tensor("dO·V^T", l.scores, l.scores_strides, f32);
  g.matmul("dO·V^T", dout, vt, dp);
  const TensorRef dp_centered = g.virtual_tensor("dP - delta", l.scores, l.scores_strides, f32);
  g.pointwise("dP - delta", CUDNN_POINTWISE_SUB, dp, softmax_sum, dp_centered);
  const TensorRef ds_unscaled = g.virtual_tensor("P*(dP - delta)", l.scores, l.scores_strides, f32);
  g.pointwise("P*(dP - delta)", CUDNN_POINTWISE_MUL, dp_centered, p, ds_unscaled);
  const TensorRef ds = g.virtual_tensor("dS", l.scores, l.scores_strides, f32);
  g.pointwise("dS scale", CUDNN_POINTWISE_MUL, ds_unscaled, scale, ds);
  const TensorRef dst = g.virtual_tensor("dS^T", l.scores_t, l.scores_t_strides, io);
  g.reshape("dS^T", ds, dst);
  g.matmul("dS^T·Q", dst, q, dk);

  // dQ = dS·K, with K the transpose of Kᵀ (typed f32 as the frontend leaves it), accumulated in f32.
  const TensorRef k = g.virtual_tensor("K", l.kv, l.kv_strides, f32);
  g.reshape("K", kt, k);
  g.matmul("dS·K", ds, k, dq_accum);
  g.pointwise("dQ", CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, dq);
}

bool aligned16(const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0; }

// cuDNN releases whose fused attention has known bugs for the graphs above (the frontend works
// around them or refuses the same cases), or "" when the loaded library has none.
std::string known_cudnn_bug(bool backward, int64_t sk) {
  const size_t version = cudnnGetVersion();  // major·10000 + minor·100 + patch
  if (!backward && (version == 91000 || version == 91001)) {
    return "cuDNN " + std::to_string(version) + " has known bf16/f16 SDPA forward bugs; use 9.10.2 or newer";
  }
  if (backward && version <= 91500 && sk % 128 != 0) {
    return "cuDNN " + std::to_string(version) +
           " needs a padding-mask workaround in the SDPA backward when Sk is not a multiple of 128; use 9.15.1 or "
           "newer";
  }
  return {};
}

// Why cuDNN's fused attention cannot take a dtype and head dim at all, or "".
std::string unsupported_reason(DType dtype, int64_t d) {
  if (dtype != DType::bf16 && dtype != DType::f16) {
    return std::string(dtype_name(dtype)) + " tensors (cuDNN fused attention takes bf16 or f16)";
  }
  if (d > 128 || d % 8 != 0) {
    return "head dim " + std::to_string(d) + " (cuDNN fused attention takes head dims up to 128, multiples of 8)";
  }
  return {};
}

// The operands of one forward or backward, already placed in memory the way `layout` says. For the
// packed layout k and v (dk and dv) point into the same buffer as q (dq).
struct Operands {
  const void *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *dout = nullptr;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr;
};

const void* offset_bytes(const void* p, int64_t elements, DType dtype) {
  return static_cast<const char*>(p) + elements * static_cast<int64_t>(dtype_size(dtype));
}
void* offset_bytes(void* p, int64_t elements, DType dtype) {
  return static_cast<char*>(p) + elements * static_cast<int64_t>(dtype_size(dtype));
}

// execute(), with a refusal (cuDNN failing to run the plan) as false rather than an exception.
bool try_execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids,
                 const std::vector<void*>& pointers, const Tensor& like, const char* op) {
  try {
    execute(handle, plan, uids, pointers, like, op);
    return true;
  } catch (const Error&) {
    return false;
  }
}

// Runs the forward graph; `like` gives the device and dtype. False with why_not when no plan builds.
bool run_forward(const Tensor& like, AttentionLayout layout, const Sizes& z, const Operands& ops, void* out, void* lse,
                 double scale, std::string& why_not) {
  why_not = known_cudnn_bug(false, z.sk);
  if (!why_not.empty()) return false;
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  octet::cuda::DeviceGuard device(like.device().index);
  const cudnnHandle_t handle = handle_for(like.device().index);
  const cudnnDataType_t io = cudnn_dtype(like.dtype());
  float scale_value = static_cast<float>(scale);
  const std::vector<int64_t> uids = {kQ, kK, kV, kScale, kOut, kStats};
  const std::vector<void*> pointers = {const_cast<void*>(ops.q), const_cast<void*>(ops.k), const_cast<void*>(ops.v),
                                       &scale_value, out, lse};
  constexpr const char* op = "cuDNN attention forward";
  const bool tune = autotune_enabled();
  // Autotuning's trials write out and lse, which the real run writes again after them.
  PlanTrial trial;
  if (tune) trial = [&](const Plan& candidate) { return try_execute(handle, candidate, uids, pointers, like, op); };
  const PlanKey key{like.device().index, layout, z.b, z.h, z.s, z.sk, z.d, like.dtype(), scale, false, tune};
  const Plan* plan =
      find_plan(key, handle, [&](GraphBuilder& g) { build_forward_graph(g, z, layout, io); }, trial, why_not);
  if (plan == nullptr) return false;
  execute(handle, *plan, uids, pointers, like, op);
  return true;
}

// Runs the backward graph, writing ops.dq, ops.dk and ops.dv. Needs at least one query and one key.
bool run_backward(const Tensor& like, AttentionLayout layout, const Sizes& z, const Operands& ops, const Tensor& lse,
                  double scale, std::string& why_not) {
  why_not = known_cudnn_bug(true, z.sk);
  if (!why_not.empty()) return false;
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  octet::cuda::DeviceGuard device(like.device().index);
  const cudnnHandle_t handle = handle_for(like.device().index);
  const cudnnDataType_t io = cudnn_dtype(like.dtype());
  // The engine's own f32 buffers (the frontend carves them out of its workspace), allocated before
  // the plan only when autotuning's trials need them.
  Tensor softmax_sum, dq_accum;
  float scale_value = static_cast<float>(scale);
  float one = 1.0f;
  const std::vector<int64_t> uids = {kQ,  kK,  kV,  kOut, kDout, kStats,     kScale,
                                     kOne, kDq, kDk, kDv,  kSoftmaxSum, kDqAccum};
  std::vector<void*> pointers;
  const auto prepare = [&] {
    softmax_sum = empty({z.b, z.h, z.s}, DType::f32, like.device());
    dq_accum = empty({z.b, z.h, z.s, z.d}, DType::f32, like.device());
    pointers = {const_cast<void*>(ops.q),    const_cast<void*>(ops.k),
                const_cast<void*>(ops.v),    const_cast<void*>(ops.out),
                const_cast<void*>(ops.dout), lse.data_ptr(),
                &scale_value,                &one,
                ops.dq,                      ops.dk,
                ops.dv,                      softmax_sum.data_ptr(),
                dq_accum.data_ptr()};
  };
  // From cuDNN 9.6 the heuristics' first engine clears the dQ accumulator itself (as observed); any
  // other engine, which autotuning may pick, gets it cleared as before 9.6.
  const auto clear_accumulator = [&](const Plan& p) {
    if (cudnnGetVersion() < 90600 || !p.heuristics_first) {
      const cudaStream_t stream = octet::cuda::current_stream(like.device().index);
      octet::cuda::check(cudaMemsetAsync(dq_accum.data_ptr(), 0, dq_accum.nbytes(), stream),
                         "cuDNN attention backward: zero the dQ accumulator");
    }
  };
  constexpr const char* op = "cuDNN attention backward";
  const bool tune = autotune_enabled();
  if (tune) prepare();
  // Autotuning's trials write dq, dk and dv (and the engine's buffers), which the real run writes
  // again after them; each clears the accumulator as the real run would with that engine.
  PlanTrial trial;
  if (tune) {
    trial = [&](const Plan& candidate) {
      clear_accumulator(candidate);
      return try_execute(handle, candidate, uids, pointers, like, op);
    };
  }
  const PlanKey key{like.device().index, layout, z.b, z.h, z.s, z.sk, z.d, like.dtype(), scale, true, tune};
  const Plan* plan =
      find_plan(key, handle, [&](GraphBuilder& g) { build_backward_graph(g, z, layout, io); }, trial, why_not);
  if (plan == nullptr) return false;
  if (!tune) prepare();
  clear_accumulator(*plan);
  execute(handle, *plan, uids, pointers, like, op);
  return true;
}

}  // namespace

std::string cudnn_attention_unsupported_reason(const Tensor& q, const Tensor& k, const Tensor& v) {
  std::string why = unsupported_reason(q.dtype(), q.size(3));
  if (why.empty() && (!aligned16(q) || !aligned16(k) || !aligned16(v))) {
    why = "q, k or v not 16-byte aligned (views at odd offsets)";
  }
  return why;
}

std::string cudnn_packed_attention_unsupported_reason(const Tensor& qkv) {
  // With D a multiple of 8, k and v start H·D·2 bytes apart: aligned whenever qkv is.
  std::string why = unsupported_reason(qkv.dtype(), qkv.size(4));
  if (why.empty() && !aligned16(qkv)) why = "qkv not 16-byte aligned (a view at an odd offset)";
  return why;
}

std::optional<AttentionOutput> cudnn_attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                                                       std::string& why_not) {
  const Sizes z = sizes_of(q, k);
  Tensor out = empty(q.shape(), q.dtype(), q.device());
  Tensor lse = empty({z.b, z.h, z.s}, DType::f32, q.device());
  if (out.numel() == 0) return AttentionOutput{out, lse};
  const Operands ops{q.data_ptr(), k.data_ptr(), v.data_ptr()};
  if (!run_forward(q, AttentionLayout::kBhsd, z, ops, out.data_ptr(), lse.data_ptr(), scale, why_not)) {
    return std::nullopt;
  }
  return AttentionOutput{out, lse};
}

std::optional<AttentionOutput> cudnn_packed_attention_forward(const Tensor& qkv, double scale, std::string& why_not) {
  const Sizes z = packed_sizes_of(qkv);
  Tensor out = empty({z.b, z.s, z.h, z.d}, qkv.dtype(), qkv.device());
  Tensor lse = empty({z.b, z.h, z.s}, DType::f32, qkv.device());
  if (out.numel() == 0) return AttentionOutput{out, lse};
  const void* base = qkv.data_ptr();
  const Operands ops{base, offset_bytes(base, packed_k_offset(z), qkv.dtype()),
                     offset_bytes(base, packed_v_offset(z), qkv.dtype())};
  if (!run_forward(qkv, AttentionLayout::kPacked, z, ops, out.data_ptr(), lse.data_ptr(), scale, why_not)) {
    return std::nullopt;
  }
  return AttentionOutput{out, lse};
}

std::optional<AttentionGrads> cudnn_attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k,
                                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                                       double scale, std::string& why_not) {
  const Sizes z = sizes_of(q, k);
  if (!aligned16(dout) || !aligned16(out) || !aligned16(lse)) {
    why_not = "dout, out or lse not 16-byte aligned (views at odd offsets)";
    return std::nullopt;
  }
  Tensor dq = empty(q.shape(), q.dtype(), q.device());
  Tensor dk = empty(k.shape(), q.dtype(), q.device());
  Tensor dv = empty(v.shape(), q.dtype(), q.device());
  if (dk.numel() == 0) return AttentionGrads{dq, dk, dv};
  if (q.numel() == 0) {  // no queries: nothing flows to k and v
    const cudaStream_t stream = octet::cuda::current_stream(q.device().index);
    octet::cuda::check(cudaMemsetAsync(dk.data_ptr(), 0, dk.nbytes(), stream), "cuDNN attention backward: zero dk");
    octet::cuda::check(cudaMemsetAsync(dv.data_ptr(), 0, dv.nbytes(), stream), "cuDNN attention backward: zero dv");
    return AttentionGrads{dq, dk, dv};
  }
  Operands ops{q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), dout.data_ptr()};
  ops.dq = dq.data_ptr();
  ops.dk = dk.data_ptr();
  ops.dv = dv.data_ptr();
  if (!run_backward(q, AttentionLayout::kBhsd, z, ops, lse, scale, why_not)) return std::nullopt;
  return AttentionGrads{dq, dk, dv};
}

std::optional<Tensor> cudnn_packed_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                                      const Tensor& lse, double scale, std::string& why_not) {
  const Sizes z = packed_sizes_of(qkv);
  if (!aligned16(dout) || !aligned16(out) || !aligned16(lse)) {
    why_not = "dout, out or lse not 16-byte aligned (views at odd offsets)";
    return std::nullopt;
  }
  Tensor dqkv = empty(qkv.shape(), qkv.dtype(), qkv.device());
  if (dqkv.numel() == 0) return dqkv;  // S = Sk: no queries means no keys either
  const DType dt = qkv.dtype();
  const void* base = qkv.data_ptr();
  void* grad = dqkv.data_ptr();
  Operands ops{base, offset_bytes(base, packed_k_offset(z), dt), offset_bytes(base, packed_v_offset(z), dt),
               out.data_ptr(), dout.data_ptr()};
  ops.dq = grad;
  ops.dk = offset_bytes(grad, packed_k_offset(z), dt);
  ops.dv = offset_bytes(grad, packed_v_offset(z), dt);
  if (!run_backward(qkv, AttentionLayout::kPacked, z, ops, lse, scale, why_not)) return std::nullopt;
  return dqkv;
}

size_t cudnn_attention_cached_plans() {
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  return plan_cache().size();
}

size_t cudnn_version() { return cudnnGetVersion(); }

}  // namespace octet::kernels::cuda
