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
// stream.
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
#include "kernels/cuda/attention_cuda.h"

namespace octet::kernels::cuda {

namespace {

// ---- errors -----------------------------------------------------------------------------------------

std::string cudnn_message(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

void check(cudnnStatus_t status, const char* call, const std::string& what) {
  if (status != CUDNN_STATUS_SUCCESS) {
    OCTET_FAIL("cuDNN attention: ", call, " on ", what, " failed: ", cudnn_message(status));
  }
}

// An attribute name and its spelling, for error messages: set(ATTR(CUDNN_ATTR_TENSOR_STRIDES), ...).
#define ATTR(name) name, #name

// ---- descriptors ------------------------------------------------------------------------------------

// Owns one cuDNN backend descriptor; every call on it is checked and names the descriptor and the
// attribute when it fails.
class Descriptor {
 public:
  Descriptor(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
    check(cudnnBackendCreateDescriptor(type, &desc_), "cudnnBackendCreateDescriptor", what_);
  }
  ~Descriptor() {
    if (desc_ != nullptr) cudnnBackendDestroyDescriptor(desc_);
  }
  Descriptor(Descriptor&& other) noexcept : desc_(std::exchange(other.desc_, nullptr)), what_(std::move(other.what_)) {}
  Descriptor(const Descriptor&) = delete;
  Descriptor& operator=(const Descriptor&) = delete;
  Descriptor& operator=(Descriptor&&) = delete;

  cudnnBackendDescriptor_t get() const { return desc_; }

  void set(cudnnBackendAttributeName_t name, const char* name_text, cudnnBackendAttributeType_t type, int64_t count,
           const void* values) {
    check(cudnnBackendSetAttribute(desc_, name, type, count, values), "cudnnBackendSetAttribute",
          what_ + " " + name_text);
  }
  void set_descriptor(cudnnBackendAttributeName_t name, const char* name_text, cudnnBackendDescriptor_t value) {
    set(name, name_text, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  void finalize() { check(cudnnBackendFinalize(desc_), "cudnnBackendFinalize", what_); }

 private:
  cudnnBackendDescriptor_t desc_ = nullptr;
  std::string what_;
};

// ---- operation graphs -------------------------------------------------------------------------------

using Dims = std::array<int64_t, 4>;

// Row-major strides of a contiguous [d0, d1, d2, d3] tensor.
Dims contiguous_strides(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

struct TensorRef {
  cudnnBackendDescriptor_t desc;
  int64_t uid;
};

// Collects tensors and operations; every descriptor stays alive in `owned_` for as long as the
// plan built from them (the frontend keeps them too). A deque, so that references handed out by
// own() stay valid while more descriptors are added.
class GraphBuilder {
 public:
  // A tensor in memory, named by the caller's uid (the variant pack refers to it by that uid).
  TensorRef tensor(const char* name, int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return make_tensor(name, uid, dims, strides, type, false, false);
  }
  // The backward's f32 dQ accumulator: in memory, in the F16x16 reordering the frontend declares for it.
  TensorRef accumulator(const char* name, int64_t uid, const Dims& dims, const Dims& strides) {
    return make_tensor(name, uid, dims, strides, CUDNN_DATA_FLOAT, false, false, CUDNN_TENSOR_REORDERING_F16x16);
  }
  // A tensor that lives only inside the fused kernel.
  TensorRef virtual_tensor(const char* name, const Dims& dims, const Dims& strides, cudnnDataType_t type) {
    return make_tensor(name, next_virtual_uid_++, dims, strides, type, true, false);
  }
  // An f32 scalar passed by value at execution (the variant pack points at a host float).
  TensorRef scalar(const char* name, int64_t uid) {
    const Dims ones = {1, 1, 1, 1};
    return make_tensor(name, uid, ones, ones, CUDNN_DATA_FLOAT, false, true);
  }

  void matmul(const char* name, TensorRef a, TensorRef b, TensorRef c) {
    Descriptor& desc = own(CUDNN_BACKEND_MATMUL_DESCRIPTOR, name, "matmul");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    desc.set(ATTR(CUDNN_ATTR_MATMUL_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &compute);
    desc.finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name, "matmul operation");
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_MATMUL_ADESC), a.desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_MATMUL_BDESC), b.desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_MATMUL_CDESC), c.desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_MATMUL_DESC), desc.get());
    add_operation(op);
  }

  // y = mode(x) or y = mode(x, b), computed in f32.
  void pointwise(const char* name, cudnnPointwiseMode_t mode, TensorRef x, const TensorRef* b, TensorRef y) {
    Descriptor& desc = own(CUDNN_BACKEND_POINTWISE_DESCRIPTOR, name, "pointwise");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    desc.set(ATTR(CUDNN_ATTR_POINTWISE_MODE), CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    desc.set(ATTR(CUDNN_ATTR_POINTWISE_MATH_PREC), CUDNN_TYPE_DATA_TYPE, 1, &compute);
    desc.finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, name, "pointwise operation");
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR), desc.get());
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), x.desc);
    if (b != nullptr) op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_BDESC), b->desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_YDESC), y.desc);
    const float one = 1.0f;
    op.set(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1), CUDNN_TYPE_FLOAT, 1, &one);
    op.set(ATTR(CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2), CUDNN_TYPE_FLOAT, 1, &one);
    add_operation(op);
  }
  void pointwise(const char* name, cudnnPointwiseMode_t mode, TensorRef x, TensorRef b, TensorRef y) {
    pointwise(name, mode, x, &b, y);
  }

  // y = reduce(x) over the dims where y has size 1, in f32.
  void reduction(const char* name, cudnnReduceTensorOp_t reduce, TensorRef x, TensorRef y) {
    Descriptor& desc = own(CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name, "reduction");
    const cudnnDataType_t compute = CUDNN_DATA_FLOAT;
    desc.set(ATTR(CUDNN_ATTR_REDUCTION_COMP_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &compute);
    desc.set(ATTR(CUDNN_ATTR_REDUCTION_OPERATOR), CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &reduce);
    desc.finalize();
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name, "reduction operation");
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_REDUCTION_DESC), desc.get());
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_REDUCTION_XDESC), x.desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_REDUCTION_YDESC), y.desc);
    add_operation(op);
  }

  // y is x seen through other dims and strides (a transpose, here).
  void reshape(const char* name, TensorRef x, TensorRef y) {
    Descriptor& op = own(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name, "reshape operation");
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_RESHAPE_XDESC), x.desc);
    op.set_descriptor(ATTR(CUDNN_ATTR_OPERATION_RESHAPE_YDESC), y.desc);
    add_operation(op);
  }

  const std::vector<cudnnBackendDescriptor_t>& operations() const { return operations_; }
  std::deque<Descriptor> take_descriptors() { return std::move(owned_); }

 private:
  TensorRef make_tensor(const char* name, int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                        bool is_virtual, bool by_value,
                        cudnnBackendTensorReordering_t reordering = CUDNN_TENSOR_REORDERING_NONE) {
    Descriptor& t = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR, name, "tensor");
    const int64_t alignment = 16;
    t.set(ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &type);
    t.set(ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64, 4, dims.data());
    t.set(ATTR(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64, 4, strides.data());
    t.set(ATTR(CUDNN_ATTR_TENSOR_UNIQUE_ID), CUDNN_TYPE_INT64, 1, &uid);
    t.set(ATTR(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), CUDNN_TYPE_INT64, 1, &alignment);
    if (is_virtual) t.set(ATTR(CUDNN_ATTR_TENSOR_IS_VIRTUAL), CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(ATTR(CUDNN_ATTR_TENSOR_IS_BY_VALUE), CUDNN_TYPE_BOOLEAN, 1, &by_value);
    if (reordering != CUDNN_TENSOR_REORDERING_NONE) {
      t.set(ATTR(CUDNN_ATTR_TENSOR_REORDERING_MODE), CUDNN_TYPE_TENSOR_REORDERING_MODE, 1, &reordering);
    }
    t.finalize();
    return {t.get(), uid};
  }

  Descriptor& own(cudnnBackendDescriptorType_t type, const char* name, const char* kind) {
    owned_.emplace_back(type, std::string(kind) + " '" + name + "'");
    return owned_.back();
  }
  void add_operation(Descriptor& op) {
    op.finalize();
    operations_.push_back(op.get());
  }

  static constexpr int64_t kFirstVirtualUid = 1000;  // above every caller-chosen uid
  int64_t next_virtual_uid_ = kFirstVirtualUid;
  std::deque<Descriptor> owned_;
  std::vector<cudnnBackendDescriptor_t> operations_;
};

// ---- plans --------------------------------------------------------------------------------------------

struct Plan {
  std::deque<Descriptor> graph_parts;  // tensors, operations, the graph and the engine config
  std::unique_ptr<Descriptor> execution_plan;
  int64_t workspace_bytes = 0;
};

// Finalizes the graph and asks cuDNN's heuristics (mode A, then the fallback list) for engine
// configurations, keeping the first one whose execution plan finalizes. Returns nullptr with the
// reason in why_not when none does, or when cuDNN refuses the graph itself.
std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, GraphBuilder& builder, std::string& why_not) {
  auto plan = std::make_unique<Plan>();
  try {
    Descriptor graph(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
    graph.set(ATTR(CUDNN_ATTR_OPERATIONGRAPH_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
    const auto& ops = builder.operations();
    graph.set(ATTR(CUDNN_ATTR_OPERATIONGRAPH_OPS), CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<int64_t>(ops.size()),
              ops.data());
    graph.finalize();
    std::string last_failure = "the heuristics returned no engine configuration";
    for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
      Descriptor heuristics(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics");
      heuristics.set_descriptor(ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), graph.get());
      heuristics.set(ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
      heuristics.finalize();
      int64_t available = 0;
      check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                     &available, nullptr),
            "cudnnBackendGetAttribute", "engine heuristics CUDNN_ATTR_ENGINEHEUR_RESULTS (count)");
      if (available <= 0) continue;
      std::vector<Descriptor> configs;
      std::vector<cudnnBackendDescriptor_t> raw_configs;
      for (int64_t i = 0; i < available; ++i) {
        configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config");
        raw_configs.push_back(configs.back().get());
      }
      int64_t returned = 0;
      check(cudnnBackendGetAttribute(heuristics.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                     available, &returned, raw_configs.data()),
            "cudnnBackendGetAttribute", "engine heuristics CUDNN_ATTR_ENGINEHEUR_RESULTS");
      for (int64_t i = 0; i < returned && i < available; ++i) {
        auto candidate = std::make_unique<Descriptor>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, "execution plan");
        candidate->set(ATTR(CUDNN_ATTR_EXECUTION_PLAN_HANDLE), CUDNN_TYPE_HANDLE, 1, &handle);
        candidate->set_descriptor(ATTR(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG), raw_configs[i]);
        const cudnnStatus_t status = cudnnBackendFinalize(candidate->get());
        if (status != CUDNN_STATUS_SUCCESS) {  // this engine cannot run the graph; try the next one
          last_failure = "cudnnBackendFinalize on an execution plan failed: " + cudnn_message(status);
          continue;
        }
        int64_t returned_sizes = 0;
        check(cudnnBackendGetAttribute(candidate->get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1,
                                       &returned_sizes, &plan->workspace_bytes),
              "cudnnBackendGetAttribute", "execution plan CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE");
        plan->execution_plan = std::move(candidate);
        plan->graph_parts = builder.take_descriptors();
        plan->graph_parts.push_back(std::move(graph));
        plan->graph_parts.push_back(std::move(configs[i]));
        return plan;
      }
    }
    why_not = "cuDNN has no engine for this attention graph: " + last_failure;
  } catch (const Error& e) {
    why_not = e.what();
  }
  return nullptr;
}

// ---- handles and the plan cache -------------------------------------------------------------------------

struct PlanKey {
  int device;
  AttentionLayout layout;
  int64_t b, h, s, sk, d;
  DType dtype;
  double scale;
  bool backward;
  auto tie() const { return std::tie(device, layout, b, h, s, sk, d, dtype, scale, backward); }
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

// Looks the plan up, building and caching it (or its absence) on the first call. Caller holds the mutex.
template <class BuildGraph>
const Plan* find_plan(const PlanKey& key, cudnnHandle_t handle, BuildGraph&& build_graph, std::string& why_not) {
  auto& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    CacheEntry entry;
    try {
      GraphBuilder builder;
      build_graph(builder);
      entry.plan = build_plan(handle, builder, entry.why_not);
    } catch (const Error& e) {  // cuDNN refused a tensor or an operation of the graph
      entry.why_not = e.what();
    }
    it = cache.emplace(key, std::move(entry)).first;
  }
  if (it->second.plan == nullptr) why_not = it->second.why_not;
  return it->second.plan.get();
}

// Runs a plan with the tensors named by uid, on the device's current stream.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
             const Tensor& like, const char* op) {
  const cudaStream_t stream = octet::cuda::current_stream(like.device().index);
  // Workspace from the stream-ordered pool: freed at the end of this call, reused by the next.
  Tensor workspace;
  void* workspace_ptr = nullptr;
  if (plan.workspace_bytes > 0) {
    workspace = empty({plan.workspace_bytes}, DType::u8, like.device());
    workspace_ptr = workspace.data_ptr();
  }
  Descriptor pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, std::string(op) + " variant pack");
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS), CUDNN_TYPE_INT64, static_cast<int64_t>(uids.size()), uids.data());
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS), CUDNN_TYPE_VOID_PTR, static_cast<int64_t>(pointers.size()),
           pointers.data());
  pack.set(ATTR(CUDNN_ATTR_VARIANT_PACK_WORKSPACE), CUDNN_TYPE_VOID_PTR, 1, &workspace_ptr);
  pack.finalize();
  check(cudnnSetStream(handle, stream), "cudnnSetStream", op);
  check(cudnnBackendExecute(handle, plan.execution_plan->get(), pack.get()), "cudnnBackendExecute", op);
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

// Runs the forward graph; `like` gives the device and dtype. False with why_not when no plan builds.
bool run_forward(const Tensor& like, AttentionLayout layout, const Sizes& z, const Operands& ops, void* out, void* lse,
                 double scale, std::string& why_not) {
  why_not = known_cudnn_bug(false, z.sk);
  if (!why_not.empty()) return false;
  std::lock_guard<std::mutex> lock(cudnn_mutex());
  octet::cuda::DeviceGuard device(like.device().index);
  const cudnnHandle_t handle = handle_for(like.device().index);
  const cudnnDataType_t io = cudnn_dtype(like.dtype());
  const PlanKey key{like.device().index, layout, z.b, z.h, z.s, z.sk, z.d, like.dtype(), scale, false};
  const Plan* plan =
      find_plan(key, handle, [&](GraphBuilder& g) { build_forward_graph(g, z, layout, io); }, why_not);
  if (plan == nullptr) return false;
  float scale_value = static_cast<float>(scale);
  const std::vector<int64_t> uids = {kQ, kK, kV, kScale, kOut, kStats};
  const std::vector<void*> pointers = {const_cast<void*>(ops.q), const_cast<void*>(ops.k), const_cast<void*>(ops.v),
                                       &scale_value, out, lse};
  execute(handle, *plan, uids, pointers, like, "cuDNN attention forward");
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
  const PlanKey key{like.device().index, layout, z.b, z.h, z.s, z.sk, z.d, like.dtype(), scale, true};
  const Plan* plan =
      find_plan(key, handle, [&](GraphBuilder& g) { build_backward_graph(g, z, layout, io); }, why_not);
  if (plan == nullptr) return false;

  // The engine's own f32 buffers (the frontend carves them out of its workspace).
  Tensor softmax_sum = empty({z.b, z.h, z.s}, DType::f32, like.device());
  Tensor dq_accum = empty({z.b, z.h, z.s, z.d}, DType::f32, like.device());
  if (cudnnGetVersion() < 90600) {  // from 9.6 the engine clears the accumulator itself
    const cudaStream_t stream = octet::cuda::current_stream(like.device().index);
    octet::cuda::check(cudaMemsetAsync(dq_accum.data_ptr(), 0, dq_accum.nbytes(), stream),
                       "cuDNN attention backward: zero the dQ accumulator");
  }
  float scale_value = static_cast<float>(scale);
  float one = 1.0f;
  const std::vector<int64_t> uids = {kQ,  kK,  kV,  kOut, kDout, kStats,     kScale,
                                     kOne, kDq, kDk, kDv,  kSoftmaxSum, kDqAccum};
  const std::vector<void*> pointers = {const_cast<void*>(ops.q),    const_cast<void*>(ops.k),
                                       const_cast<void*>(ops.v),    const_cast<void*>(ops.out),
                                       const_cast<void*>(ops.dout), lse.data_ptr(),
                                       &scale_value,                &one,
                                       ops.dq,                      ops.dk,
                                       ops.dv,                      softmax_sum.data_ptr(),
                                       dq_accum.data_ptr()};
  execute(handle, *plan, uids, pointers, like, "cuDNN attention backward");
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
