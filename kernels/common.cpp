#include "kernels/common.h"

namespace octet::kernels {

std::string describe_all(std::initializer_list<const Tensor*> tensors) {
  std::string s;
  char name = 'a';
  for (const Tensor* t : tensors) {
    if (!s.empty()) s += ", ";
    s += std::string(1, name++) + ": " + t->describe();
  }
  return s;
}

void check_defined(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* t : tensors) OCTET_CHECK(t->defined(), op, ": an input is undefined (", describe_all(tensors), ")");
}

void check_same_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  check_defined(op, tensors);
  const Device d = (*tensors.begin())->device();
  for (const Tensor* t : tensors) {
    OCTET_CHECK(t->device() == d, op, ": inputs are on different devices (", describe_all(tensors),
                "); move them to one device with .to(device)");
  }
}

void check_same_dtype(const char* op, std::initializer_list<const Tensor*> tensors) {
  check_defined(op, tensors);
  const DType d = (*tensors.begin())->dtype();
  for (const Tensor* t : tensors) {
    OCTET_CHECK(t->dtype() == d, op, ": inputs have different dtypes (", describe_all(tensors),
                "); Octet does not promote, convert one with .to(dtype)");
  }
}

void check_floating(const char* op, const Tensor& t) {
  OCTET_CHECK(is_floating(t.dtype()), op, ": needs a floating tensor, got ", t.describe());
}

void check_layernorm_weight_dtype(const char* op, const Tensor& x, const Tensor& weight) {
  OCTET_CHECK(weight.dtype() == DType::f32 || weight.dtype() == x.dtype(), op, ": weight is ",
              dtype_name(weight.dtype()), " but x is ", dtype_name(x.dtype()), "; a LayerNorm's weight and bias "
              "must be f32 or x's dtype: convert them with .to(DType::f32) (", describe_all({&x, &weight}), ")");
}

void check_dim(const char* op, const Tensor& t, int64_t ndim) {
  OCTET_CHECK(t.dim() == ndim, op, ": expected a ", ndim, "-d tensor, got ", t.describe());
}

void check_cpu(const char* op, std::initializer_list<const Tensor*> tensors) {
  check_defined(op, tensors);
  const char* why = OCTET_HAS_CUDA ? "this op has no CUDA kernel for these inputs" : "Octet was built without CUDA";
  const char* fix = OCTET_HAS_CUDA ? "move the tensors to the cpu"
                                   : "rebuild with OCTET_CUDA=ON (nvcc on PATH), or move the tensors to the cpu";
  for (const Tensor* t : tensors) {
    OCTET_CHECK(t->device().is_cpu(), op, ": ", why, " (", describe_all(tensors), "); ", fix);
  }
}

}  // namespace octet::kernels
