#pragma once
// Tensor: a handle to shared storage plus a byte offset, a shape and a dtype. Tensors are always
// contiguous (row-major); a view is another tensor over the same storage at some offset, which is
// how FSDP lays module parameters over one flat buffer. Copying a Tensor copies the handle, as in
// PyTorch; clone() copies the data.
//
// Autograd state (requires_grad, grad, grad_fn, hooks) rides along in an optional AutogradMeta, so
// users never juggle two tensor types. The graph machinery itself lives in autograd/.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/host_sync.h"
#include "core/shape.h"
#include "core/storage.h"

namespace octet {

namespace autograd {
class Node;
}  // namespace autograd

class Tensor;
struct TensorImpl;

// Gradient hooks: a tensor hook may replace the gradient flowing into the tensor (return an
// undefined Tensor to keep it); a post-accumulate hook sees a leaf's .grad after it is updated.
using GradHook = std::function<Tensor(const Tensor& grad)>;
using PostAccumulateGradHook = std::function<void(Tensor& leaf)>;

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  // A tensor of `shape` over `storage` starting `offset_bytes` in. Checks that it fits.
  Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype);

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t dim() const { return shape().ndim(); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t numel() const { return shape().numel(); }
  DType dtype() const;
  Device device() const;
  bool is_cuda() const { return device().is_cuda(); }
  size_t element_size() const { return dtype_size(dtype()); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * element_size(); }
  size_t storage_offset() const;  // in bytes
  const std::shared_ptr<Storage>& storage() const;
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  long use_count() const { return impl_.use_count(); }  // handles sharing this tensor's metadata
  TensorImpl* impl() const { return impl_.get(); }

  // The storage's write version (Storage::version): in-place writers bump it, caches compare it.
  uint64_t version() const { return storage()->version(); }
  void bump_version() const { storage()->bump_version(); }

  // Raw bytes, on whichever device holds them.
  void* data_ptr() const;
  // Typed host pointer; checks that T matches the dtype and that the tensor is on the CPU.
  template <class T> T* data() const;

  // --- views (share storage) -------------------------------------------------------------------
  // These do not record autograd; on a tensor that requires grad (with grad mode on) they throw
  // and point to the differentiable versions in autograd/ops.h.
  Tensor reshape(Shape shape) const;            // one dim may be -1
  Tensor flatten() const { return reshape({-1}); }
  Tensor narrow(int64_t start, int64_t length) const;  // along dim 0
  Tensor select(int64_t index) const;           // along dim 0, dropping it
  Tensor detach() const;                        // same data, no autograd state

  // --- copies ---------------------------------------------------------------------------------
  Tensor to(DType dtype) const;    // returns *this when the dtype already matches
  Tensor to(Device device) const;  // returns *this when the device already matches
  Tensor clone() const;
  // In-place writes go to the shared storage, so they are const on the handle (as in PyTorch).
  const Tensor& copy_(const Tensor& src) const;  // same numel; converts dtype and crosses devices
  const Tensor& fill_(double value) const;
  const Tensor& zero_() const { return fill_(0.0); }
  // Reads on the host. On a GPU both wait for the tensor's stream to reach the value; both count as
  // host syncs (core/host_sync.h), on every device.
  double item() const;  // of a one-element tensor, as double
  template <class T> T item() const { return static_cast<T>(item()); }
  template <class T> std::vector<T> to_vector() const;  // any dtype/device, converted to T on the host

  // --- autograd state -----------------------------------------------------------------------------
  bool requires_grad() const;
  Tensor& requires_grad_(bool requires_grad = true);  // leaves only
  const Tensor& grad() const;                         // undefined until a backward reaches it
  void set_grad(Tensor grad);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  bool is_leaf() const { return grad_fn() == nullptr; }
  void register_hook(GradHook hook);
  void register_post_accumulate_grad_hook(PostAccumulateGradHook hook);  // leaves only
  // PyTorch's `param.data = src`: points this tensor's metadata at src's storage, offset, shape and
  // dtype while keeping its autograd state (requires_grad, grad, hooks), so every handle sharing it
  // (a Module's parameter list, an optimizer, an AccumulateGrad node) sees the new data. Leaves
  // only. The grad is left as is: a caller that changes shape, dtype or device moves or drops it.
  void set_data(const Tensor& src) const;
  // Runs the backward pass from this tensor. `grad` defaults to 1 for a one-element tensor.
  // Defined in autograd/engine.cpp: link octet_autograd to use it.
  void backward(const Tensor& grad = Tensor(), bool retain_graph = false) const;

  // "f32[2, 3] on cpu": the summary that error messages use.
  std::string describe() const;

 private:
  void require_defined(const char* op) const;
  std::shared_ptr<TensorImpl> impl_;
};

// Autograd's bookkeeping for one tensor. Created on first use; plain data tensors have none.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;  // null for leaves
  uint32_t output_nr = 0;                   // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // a leaf's AccumulateGrad, shared by graphs
  // Shared with the node that consumes this tensor's gradient, so hooks keep firing after the
  // user drops the tensor handle (as in PyTorch).
  std::shared_ptr<std::vector<GradHook>> hooks = std::make_shared<std::vector<GradHook>>();
  std::vector<PostAccumulateGradHook> post_accumulate_hooks;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes
  Shape shape;
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;

  AutogradMeta& autograd_meta() {
    if (!autograd) autograd = std::make_unique<AutogradMeta>();
    return *autograd;
  }
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- factories ------------------------------------------------------------------------------------
class Generator;

Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
// A host tensor in page-locked memory: copies from it to a GPU can run beside compute. CUDA builds.
Tensor empty_pinned(const Shape& shape, DType dtype = DType::f32);
Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor full(const Shape& shape, double value, DType dtype = DType::f32, Device device = Device::cpu());
// [start, end) in steps of `step`, like Python's range.
Tensor arange(double start, double end, double step = 1.0, DType dtype = DType::f32, Device device = Device::cpu());
inline Tensor arange(int64_t end, DType dtype = DType::i64) { return arange(0.0, static_cast<double>(end), 1.0, dtype); }
// Uniform in [0, 1) and standard normal, from a Philox stream (core/random.h). Without a
// generator they draw from default_generator().
Tensor rand(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu());
Tensor randn(const Shape& shape, Generator& gen, DType dtype = DType::f32, Device device = Device::cpu());
Tensor rand(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
Tensor randn(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
// Copies host values into a new tensor, converting from T to `dtype`.
template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype = dtype_of<T>(),
                   Device device = Device::cpu());

// ---- template definitions -------------------------------------------------------------------------
template <class T>
T* Tensor::data() const {
  require_defined("data");
  OCTET_CHECK(dtype() == dtype_of<T>(), "data<", dtype_name(dtype_of<T>()), ">: tensor is ", describe(),
              "; ask for data<> of its own dtype or convert with .to(", dtype_name(dtype_of<T>()), ")");
  OCTET_CHECK(device().is_cpu(), "data<", dtype_name(dtype_of<T>()), ">: tensor is ", describe(),
              "; host pointers need .to(Device::cpu()) first");
  return static_cast<T*>(data_ptr());
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  require_defined("to_vector");
  const host_sync::Scope counted(host_sync::Kind::to_vector, device().is_cpu());
  Tensor host = detach().to(Device::cpu()).to(dtype_of<T>());  // a read: no graph to keep
  const T* p = host.data<T>();
  return std::vector<T>(p, p + host.numel());
}

template <class T>
Tensor from_vector(const std::vector<T>& values, const Shape& shape, DType dtype, Device device) {
  OCTET_CHECK(static_cast<int64_t>(values.size()) == shape.numel(), "from_vector: ", values.size(),
              " values cannot fill shape ", shape, " (", shape.numel(), " elements)");
  Tensor t = empty(shape, dtype, Device::cpu());
  convert_elements(values.data(), dtype_of<T>(), t.data_ptr(), dtype, shape.numel());
  return t.to(device);
}

}  // namespace octet
