#include "core/tensor.h"

#include "core/op_ledger.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "core/cuda_convert.h"
#include "core/grad_mode.h"
#include "core/philox.h"
#include "core/random.h"

namespace octet {

namespace {
const Shape kEmptyShape{};
const std::shared_ptr<autograd::Node> kNoNode;
const Tensor kUndefined;
const std::shared_ptr<Storage> kNoStorage;

// Core's views and copies do not record a graph; refuse rather than silently cut it.
void refuse_if_recording(const Tensor& t, const char* op, const char* differentiable) {
  OCTET_CHECK(!(t.requires_grad() && GradMode::is_enabled()), op, ": tensor ", t.describe(),
              " requires grad and this method does not record autograd; use ", differentiable,
              " from autograd/ops.h, or call .detach() first / run under NoGradGuard");
}
}  // namespace

Tensor::Tensor(std::shared_ptr<Storage> storage, size_t offset_bytes, Shape shape, DType dtype) {
  const size_t needed = offset_bytes + static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  OCTET_CHECK(storage != nullptr, "Tensor: null storage");
  OCTET_CHECK(needed <= storage->nbytes(), "Tensor: a ", dtype_name(dtype), shape, " view at byte offset ",
              offset_bytes, " needs ", needed, " bytes but the storage holds ", storage->nbytes());
  impl_ = std::make_shared<TensorImpl>();
  impl_->storage = std::move(storage);
  impl_->offset = offset_bytes;
  impl_->shape = std::move(shape);
  impl_->dtype = dtype;
}

void Tensor::require_defined(const char* op) const {
  OCTET_CHECK(impl_ != nullptr, op, ": the tensor is undefined (default-constructed, or a gradient that "
                                    "was never computed)");
}

const Shape& Tensor::shape() const { return impl_ ? impl_->shape : kEmptyShape; }
int64_t Tensor::size(int64_t d) const { return shape()[shape().normalize_dim(d, "size")]; }
DType Tensor::dtype() const {
  require_defined("dtype");
  return impl_->dtype;
}
Device Tensor::device() const {
  require_defined("device");
  return impl_->storage->device();
}
size_t Tensor::storage_offset() const { return impl_ ? impl_->offset : 0; }
const std::shared_ptr<Storage>& Tensor::storage() const { return impl_ ? impl_->storage : kNoStorage; }
void* Tensor::data_ptr() const {
  require_defined("data_ptr");
  OCTET_CHECK(impl_->storage->allocated() || impl_->storage->nbytes() == 0, "data_ptr: the storage of ",
              describe(), " has been released (FSDP frees a unit's gathered parameters outside its forward and "
              "backward); gather it again before reading it");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset;
}

std::string Tensor::describe() const {
  if (!impl_) return "undefined tensor";
  return std::string(dtype_name(impl_->dtype)) + impl_->shape.str() + " on " + device().str();
}

// ---- views ----------------------------------------------------------------------------------------

Tensor Tensor::reshape(Shape new_shape) const {
  require_defined("reshape");
  refuse_if_recording(*this, "reshape", "octet::reshape");
  int64_t known = 1, infer_at = -1;
  for (int64_t i = 0; i < new_shape.ndim(); ++i) {
    if (new_shape[i] == -1) {
      OCTET_CHECK(infer_at < 0, "reshape: more than one -1 in ", new_shape);
      infer_at = i;
    } else {
      OCTET_CHECK(new_shape[i] >= 0, "reshape: negative extent in ", new_shape);
      known *= new_shape[i];
    }
  }
  if (infer_at >= 0) {
    OCTET_CHECK(known != 0 && numel() % known == 0, "reshape: cannot reshape ", describe(), " to ", new_shape);
    new_shape[infer_at] = numel() / known;
  }
  OCTET_CHECK(new_shape.numel() == numel(), "reshape: cannot reshape ", describe(), " (", numel(),
              " elements) to ", new_shape, " (", new_shape.numel(), " elements)");
  return Tensor(impl_->storage, impl_->offset, std::move(new_shape), impl_->dtype);
}

Tensor Tensor::narrow(int64_t start, int64_t length) const {
  require_defined("narrow");
  refuse_if_recording(*this, "narrow", "octet::narrow");
  OCTET_CHECK(dim() >= 1, "narrow: needs at least one dim, got ", describe());
  OCTET_CHECK(start >= 0 && length >= 0 && start + length <= shape()[0], "narrow: rows [", start, ", ",
              start + length, ") are outside dim 0 of ", describe());
  Shape s = shape();
  const size_t row_bytes = static_cast<size_t>(numel() / std::max<int64_t>(s[0], 1)) * element_size();
  s[0] = length;
  return Tensor(impl_->storage, impl_->offset + static_cast<size_t>(start) * row_bytes, std::move(s), impl_->dtype);
}

Tensor Tensor::select(int64_t index) const {
  Tensor row = narrow(index, 1);
  Shape s(shape().begin() + 1, shape().end());
  return Tensor(row.impl_->storage, row.impl_->offset, std::move(s), row.impl_->dtype);
}

Tensor Tensor::detach() const {
  require_defined("detach");
  return Tensor(impl_->storage, impl_->offset, impl_->shape, impl_->dtype);
}

// ---- copies ---------------------------------------------------------------------------------------

Tensor Tensor::to(DType target) const {
  require_defined("to");
  if (target == dtype()) return *this;
  refuse_if_recording(*this, "to(dtype)", "octet::cast");
  LedgerOp ledger("cast");
  ledger.read(*this).write_bytes(numel() * static_cast<int64_t>(dtype_size(target)));
  if (device().is_cpu()) {
    Tensor out = empty(shape(), target, Device::cpu());
    convert_elements(data_ptr(), dtype(), out.data_ptr(), target, numel());
    return out;
  }
#if OCTET_HAS_CUDA
  Tensor out = empty(shape(), target, device());
  cuda::convert_elements(data_ptr(), dtype(), out.data_ptr(), target, numel(), device().index);
  return out;
#else
  OCTET_FAIL("to(dtype): ", describe(), " is on a CUDA device but this build has no CUDA");
#endif
}

Tensor Tensor::to(Device target) const {
  require_defined("to");
  if (target == device()) return *this;
  refuse_if_recording(*this, "to(device)", "octet::to_device");
  LedgerOp ledger("to_device");
  ledger.read(*this).write(*this);
  Tensor out = empty(shape(), dtype(), target);
  copy_bytes(out.data_ptr(), target, data_ptr(), device(), nbytes());
  return out;
}

Tensor Tensor::clone() const {
  require_defined("clone");
  refuse_if_recording(*this, "clone", "octet::clone");
  LedgerOp ledger("clone");
  ledger.read(*this).write(*this);
  Tensor out = empty(shape(), dtype(), device());
  copy_bytes(out.data_ptr(), device(), data_ptr(), device(), nbytes());
  return out;
}

const Tensor& Tensor::copy_(const Tensor& src) const {
  require_defined("copy_");
  src.require_defined("copy_");
  OCTET_CHECK(src.numel() == numel(), "copy_: source ", src.describe(), " has ", src.numel(),
              " elements but the destination ", describe(), " has ", numel());
  LedgerOp ledger("copy_");
  ledger.read(src).write(*this);
  bump_version();
  if (src.device().is_cpu() && device().is_cpu()) {
    const Tensor converted = src.dtype() == dtype() ? src : src.detach().to(dtype());
    copy_bytes(data_ptr(), device(), converted.data_ptr(), converted.device(), nbytes());
    return *this;
  }
#if OCTET_HAS_CUDA
  // On one device: a stream-ordered copy or conversion, without waiting. Across devices: the bytes
  // cross in the source's dtype or the destination's, whichever is converted on a GPU.
  if (src.device() == device()) {
    if (src.dtype() == dtype()) {
      cuda::copy_device_bytes(data_ptr(), src.data_ptr(), nbytes(), device().index);
    } else {
      cuda::convert_elements(src.data_ptr(), src.dtype(), data_ptr(), dtype(), numel(), device().index);
    }
  } else if (src.dtype() == dtype()) {
    copy_bytes(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
  } else if (device().is_cuda()) {
    const Tensor staged = src.detach().to(device());
    cuda::convert_elements(staged.data_ptr(), staged.dtype(), data_ptr(), dtype(), numel(), device().index);
  } else {
    const Tensor converted = src.detach().to(dtype());
    copy_bytes(data_ptr(), device(), converted.data_ptr(), converted.device(), nbytes());
  }
  return *this;
#else
  OCTET_FAIL("copy_: ", src.describe(), " -> ", describe(), " involves a CUDA device but this build has no CUDA");
#endif
}

namespace {

// Writes `count` copies of one element's bytes: memset when they are all equal (zeros, most often),
// else a fill with the element's bit pattern as an integer of its width.
void fill_pattern(void* out, const unsigned char* element, size_t size, int64_t count) {
  const auto n = static_cast<size_t>(count);
  if (std::all_of(element, element + size, [&](unsigned char b) { return b == element[0]; })) {
    std::memset(out, element[0], n * size);
    return;
  }
  auto fill_as = [&](auto word) {
    std::memcpy(&word, element, sizeof word);
    std::fill_n(static_cast<decltype(word)*>(out), n, word);
  };
  switch (size) {
    case 2: fill_as(uint16_t{}); break;
    case 4: fill_as(uint32_t{}); break;
    case 8: fill_as(uint64_t{}); break;
    default: OCTET_FAIL("fill_: no fill for ", size, "-byte elements");
  }
}

}  // namespace

const Tensor& Tensor::fill_(double value) const {
  require_defined("fill_");
  LedgerOp ledger("fill_");
  ledger.write(*this);
  bump_version();
  unsigned char element[8];
  convert_elements(&value, DType::f64, element, dtype(), 1);
  if (device().is_cpu()) {
    fill_pattern(data_ptr(), element, element_size(), numel());
  } else {
#if OCTET_HAS_CUDA
    cuda::fill_elements(data_ptr(), element, element_size(), numel(), device().index);
#else
    OCTET_FAIL("fill_: ", describe(), " is on a CUDA device but this build has no CUDA");
#endif
  }
  return *this;
}

double Tensor::item() const {
  require_defined("item");
  OCTET_CHECK(numel() == 1, "item: needs a one-element tensor, got ", describe());
  const host_sync::Scope counted(host_sync::Kind::item, device().is_cpu());
  unsigned char raw[8];
  copy_bytes(raw, Device::cpu(), data_ptr(), device(), element_size());
  double value;
  convert_elements(raw, dtype(), &value, DType::f64, 1);
  return value;
}

// ---- autograd state ---------------------------------------------------------------------------

bool Tensor::requires_grad() const { return impl_ && impl_->autograd && impl_->autograd->requires_grad; }

Tensor& Tensor::requires_grad_(bool requires_grad) {
  require_defined("requires_grad_");
  OCTET_CHECK(is_leaf() || requires_grad, "requires_grad_: ", describe(),
              " is the output of an operation; only leaves can stop requiring grad (use .detach())");
  OCTET_CHECK(!requires_grad || is_floating(dtype()), "requires_grad_: only floating tensors can require grad, got ",
              describe());
  impl_->autograd_meta().requires_grad = requires_grad;
  return *this;
}

const Tensor& Tensor::grad() const { return impl_ && impl_->autograd ? impl_->autograd->grad : kUndefined; }

void Tensor::set_grad(Tensor grad) {
  require_defined("set_grad");
  if (grad.defined()) {
    OCTET_CHECK(grad.shape() == shape(), "set_grad: gradient ", grad.describe(), " does not match tensor ", describe());
  }
  impl_->autograd_meta().grad = std::move(grad);
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  return impl_ && impl_->autograd ? impl_->autograd->grad_fn : kNoNode;
}

void Tensor::register_hook(GradHook hook) {
  OCTET_CHECK(requires_grad(), "register_hook: ", describe(), " does not require grad, so no gradient will reach it");
  impl_->autograd_meta().hooks->push_back(std::move(hook));
}

void Tensor::register_post_accumulate_grad_hook(PostAccumulateGradHook hook) {
  OCTET_CHECK(requires_grad() && is_leaf(), "register_post_accumulate_grad_hook: ", describe(),
              " must be a leaf that requires grad (a parameter)");
  impl_->autograd_meta().post_accumulate_hooks.push_back(std::move(hook));
}

void Tensor::set_data(const Tensor& src) const {
  require_defined("set_data");
  OCTET_CHECK(src.defined(), "set_data: the source is undefined; pass a tensor holding the new data");
  OCTET_CHECK(is_leaf(), "set_data: ", describe(), " is the output of an operation; only leaves (parameters, "
              "buffers) can be retargeted. Detach it first if you mean a new tensor");
  OCTET_CHECK(!requires_grad() || is_floating(src.dtype()), "set_data: ", describe(),
              " requires grad, so its data must stay floating; got ", src.describe());
  impl_->storage = src.impl_->storage;
  impl_->offset = src.impl_->offset;
  impl_->shape = src.impl_->shape;
  impl_->dtype = src.impl_->dtype;
}

// ---- printing -------------------------------------------------------------------------------------

namespace {
// Prints nested brackets; dims longer than 6 show their first and last 3 entries.
void print_level(std::ostream& os, const std::vector<double>& v, const Shape& shape, int64_t dim, int64_t offset,
                 int64_t stride_product) {
  const int64_t n = shape[dim];
  const int64_t inner = stride_product / std::max<int64_t>(n, 1);
  os << "[";
  for (int64_t i = 0; i < n; ++i) {
    if (n > 6 && i == 3) {
      os << (dim + 1 == shape.ndim() ? "..., " : "...,\n");
      i = n - 3;
    }
    if (dim + 1 == shape.ndim()) {
      os << std::setw(10) << std::setprecision(4) << v[offset + i];
    } else {
      print_level(os, v, shape, dim + 1, offset + i * inner, inner);
    }
    if (i + 1 < n) os << (dim + 1 == shape.ndim() ? ", " : ",\n");
  }
  os << "]";
}
}  // namespace

std::ostream& operator<<(std::ostream& os, const Tensor& t) {
  if (!t.defined()) return os << "Tensor(undefined)";
  os << "Tensor(" << t.describe() << (t.requires_grad() ? ", requires_grad" : "") << ")\n";
  if (t.dim() == 0) return os << t.item();
  if (t.numel() == 0) return os << "[]";
  const std::vector<double> values = t.detach().to_vector<double>();
  print_level(os, values, t.shape(), 0, 0, t.numel());
  return os;
}

// ---- factories ------------------------------------------------------------------------------------

Tensor empty(const Shape& shape, DType dtype, Device device) {
  for (int64_t d : shape) OCTET_CHECK(d >= 0, "empty: negative extent in shape ", shape);
  auto storage = std::make_shared<Storage>(static_cast<size_t>(shape.numel()) * dtype_size(dtype), device);
  return Tensor(std::move(storage), 0, shape, dtype);
}

Tensor empty_pinned(const Shape& shape, DType dtype) {
  for (int64_t d : shape) OCTET_CHECK(d >= 0, "empty_pinned: negative extent in shape ", shape);
  return Tensor(Storage::pinned(static_cast<size_t>(shape.numel()) * dtype_size(dtype)), 0, shape, dtype);
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}
Tensor ones(const Shape& shape, DType dtype, Device device) { return full(shape, 1.0, dtype, device); }
Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  OCTET_CHECK(step != 0 && std::isfinite(start) && std::isfinite(end), "arange: bad range [", start, ", ", end,
              ") step ", step);
  const int64_t n = std::max<int64_t>(0, static_cast<int64_t>(std::ceil((end - start) / step)));
  std::vector<double> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = start + static_cast<double>(i) * step;
  return from_vector(values, {n}, dtype, device);
}

namespace {
// Fills an f32 buffer from the generator; `normal` selects Box-Muller over each block's two pairs.
Tensor random_fill(const Shape& shape, Generator& gen, DType dtype, Device device, bool normal) {
  OCTET_CHECK(is_floating(dtype), normal ? "randn" : "rand", ": dtype must be floating, got ", dtype_name(dtype));
  const int64_t n = shape.numel();
  const uint64_t seed = gen.seed();
  const uint64_t first_block = gen.reserve_for(n);
  Tensor values = empty(shape, DType::f32, Device::cpu());
  float* out = values.data<float>();
  const int64_t blocks = (n + 3) / 4;
#pragma omp parallel for if (n > (1 << 15))
  for (int64_t b = 0; b < blocks; ++b) {
    const philox::Words w = philox::block_words(seed, first_block + static_cast<uint64_t>(b));
    float v[4];
    if (normal) {
      for (int pair = 0; pair < 2; ++pair) {
        const float radius = std::sqrt(-2.0f * std::log(philox::uniform_open_zero(w.w[2 * pair])));
        const float angle = 6.2831853071795864f * philox::uniform(w.w[2 * pair + 1]);
        v[2 * pair] = radius * std::cos(angle);
        v[2 * pair + 1] = radius * std::sin(angle);
      }
    } else {
      for (int k = 0; k < 4; ++k) v[k] = philox::uniform(w.w[k]);
    }
    for (int k = 0; k < 4 && 4 * b + k < n; ++k) out[4 * b + k] = v[k];
  }
  return values.to(dtype).to(device);
}
}  // namespace

Tensor rand(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return random_fill(shape, gen, dtype, device, false);
}
Tensor randn(const Shape& shape, Generator& gen, DType dtype, Device device) {
  return random_fill(shape, gen, dtype, device, true);
}
Tensor rand(const Shape& shape, DType dtype, Device device) { return rand(shape, default_generator(), dtype, device); }
Tensor randn(const Shape& shape, DType dtype, Device device) { return randn(shape, default_generator(), dtype, device); }

}  // namespace octet
