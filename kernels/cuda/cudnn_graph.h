#pragma once
// The cuDNN graph (backend) API, made checkable and owned: descriptors that free themselves and name
// the attribute a failure came from, a builder that collects a graph's tensors and operations, and
// the plan built from a graph (heuristics, then the first engine configuration that finalizes) and
// its execution. Plain cuDNN, nothing about attention: kernels/cuda/attention_cudnn.cpp builds its
// graphs with it.
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace octet::kernels::cuda::cudnn {

// ---- errors -----------------------------------------------------------------------------------------

inline std::string cudnn_message(cudnnStatus_t status) {
  std::string text = cudnnGetErrorString(status);
  char detail[1024] = {0};
  cudnnGetLastErrorString(detail, sizeof detail);
  if (detail[0] != '\0') text += std::string(" (") + detail + ")";
  return text;
}

inline void check(cudnnStatus_t status, const char* call, const std::string& what) {
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
inline Dims contiguous_strides(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

struct TensorRef {
  cudnnBackendDescriptor_t desc;
  int64_t uid;
};

// Collects tensors and operations; every descriptor stays alive in `owned_` for as long as the
// plan built from them (the frontend keeps them too). A deque, so that references handed out by
// own() stay valid while more descriptors are added.
class GraphBuilder {
 public:
  // A tensor in memory, named by the caller's uid (the variant pack refers to it by that uid). `rank`
  // is how many of dims and strides count: 4 for attention's [B, H, S, D]; 3 for the [B, M, K] that
  // a matmul outside attention's fused engines takes.
  TensorRef tensor(const char* name, int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t type,
                   int rank = 4) {
    return make_tensor(name, uid, dims, strides, type, false, false, CUDNN_TENSOR_REORDERING_NONE, rank);
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
                        cudnnBackendTensorReordering_t reordering = CUDNN_TENSOR_REORDERING_NONE, int rank = 4) {
    Descriptor& t = own(CUDNN_BACKEND_TENSOR_DESCRIPTOR, name, "tensor");
    const int64_t alignment = 16;
    t.set(ATTR(CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_TYPE_DATA_TYPE, 1, &type);
    t.set(ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), CUDNN_TYPE_INT64, rank, dims.data());
    t.set(ATTR(CUDNN_ATTR_TENSOR_STRIDES), CUDNN_TYPE_INT64, rank, strides.data());
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
  // The engine configuration the heuristics put first, which runs with autotuning off; false when
  // autotuning chose another (whose habits, such as clearing its own buffers, were never observed).
  bool heuristics_first = true;
};

// One run of a candidate plan on the problem's own tensors, queued on the stream the problem runs
// on; false when cuDNN refuses it. Autotuning (kernels/autotune.h) times candidates with it.
using PlanTrial = std::function<bool(const Plan&)>;

// Finalizes the graph and asks cuDNN's heuristics (mode A, then the fallback list) for engine
// configurations. With autotuning off, keeps the first one whose execution plan finalizes; with it
// on, the fastest of the first kAutotuneCandidates that finalize in the first list where any of them
// runs, as `trial` runs them on `stream` (`what` names the problem in the log line). Returns nullptr
// with the reason in why_not when none finalizes (or, tuning, none runs), or when cuDNN refuses the
// graph; throws an error raised while the candidates are timed (a refusal is a false trial, so such
// an error is the GPU's), so that the caller caches nothing.
std::unique_ptr<Plan> build_plan(cudnnHandle_t handle, GraphBuilder& builder, std::string& why_not,
                                 cudaStream_t stream, const PlanTrial& trial, const std::function<std::string()>& what);

// Runs a plan with the tensors named by uid, on the device's current stream; `like` gives the
// device, `op` names the call in errors.
void execute(cudnnHandle_t handle, const Plan& plan, const std::vector<int64_t>& uids, const std::vector<void*>& pointers,
             const Tensor& like, const char* op);

}  // namespace octet::kernels::cuda::cudnn
