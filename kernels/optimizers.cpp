// Entry points for the fused optimizer updates: argument checks, the per-step constants (computed in
// double, rounded once to the compute type), and dispatch on device and dtype to kernels/cpu/.
#include "kernels/optimizers.h"

#include <cmath>

#include "core/float_formats.h"
#include "kernels/common.h"
#include "kernels/cpu/optimizers_cpu.h"

namespace octet::kernels {
namespace {

// Whether two tensors' bytes intersect. An in-place update whose inputs alias each other would read
// values it has already overwritten.
bool overlaps(const Tensor& a, const Tensor& b) {
  if (a.storage() != b.storage() || a.nbytes() == 0 || b.nbytes() == 0) return false;
  const size_t a0 = a.storage_offset(), b0 = b.storage_offset();
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

void check_hyperparameter(const char* op, const char* name, double value, bool ok, const char* expected) {
  OCTET_CHECK(std::isfinite(value) && ok, op, ": ", name, " must be ", expected, ", got ", value);
}

// param is the f32 or f64 master copy; every state tensor shares its shape and dtype; grad has its
// shape and its dtype, or bf16 for an f32 param. All on one device, none aliasing another.
void check_update_args(const char* op, const Tensor& param, const Tensor& grad,
                       std::initializer_list<const Tensor*> state) {
  check_defined(op, {&param, &grad});
  for (const Tensor* s : state) check_defined(op, {&param, s});
  OCTET_CHECK(param.dtype() == DType::f32 || param.dtype() == DType::f64, op, ": param is ", param.describe(),
              "; optimizers update f32 master weights (or f64), so keep the parameter in f32 and cast a copy "
              "for low-precision compute");
  OCTET_CHECK(grad.dtype() == param.dtype() || (param.dtype() == DType::f32 && grad.dtype() == DType::bf16),
              op, ": grad ", grad.describe(), " does not fit param ", param.describe(),
              "; the gradient must have the param's dtype (or bf16 for an f32 param), convert it with .to(",
              dtype_name(param.dtype()), ")");
  OCTET_CHECK(grad.shape() == param.shape(), op, ": grad ", grad.describe(), " and param ", param.describe(),
              " differ in shape; the gradient must have the param's shape");
  for (const Tensor* s : state) {
    OCTET_CHECK(s->dtype() == param.dtype() && s->shape() == param.shape(), op, ": optimizer state ",
                s->describe(), " does not match param ", param.describe(),
                "; allocate the state with the param's shape and dtype");
  }
  check_same_device(op, {&param, &grad});
  for (const Tensor* s : state) check_same_device(op, {&param, s});
  check_cpu(op, {&param, &grad});

  OCTET_CHECK(!overlaps(param, grad), op, ": param and grad share memory (", describe_all({&param, &grad}),
              "); the update would read values it has already overwritten, pass a separate gradient");
  for (const Tensor* s : state) {
    OCTET_CHECK(!overlaps(param, *s) && !overlaps(grad, *s), op, ": optimizer state ", s->describe(),
                " shares memory with the param or grad; give every state tensor its own storage");
  }
  if (state.size() == 2) {
    const Tensor& s0 = **state.begin();
    const Tensor& s1 = **(state.begin() + 1);
    OCTET_CHECK(!overlaps(s0, s1), op, ": the two state tensors share memory (", describe_all({&s0, &s1}),
                "); give each its own storage");
  }
}

// Calls f.template operator()<T, G>() with the parameter type T and the gradient's storage type G.
template <class F>
void with_update_types(const Tensor& param, const Tensor& grad, F&& f) {
  if (param.dtype() == DType::f64) return f.template operator()<double, double>();
  if (grad.dtype() == DType::bf16) return f.template operator()<float, bfloat16>();
  return f.template operator()<float, float>();
}

}  // namespace

void adamw_step_(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                 double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step) {
  const char* op = "adamw_step_";
  check_update_args(op, param, grad, {&exp_avg, &exp_avg_sq});
  check_hyperparameter(op, "lr", lr, lr >= 0, "finite and >= 0");
  check_hyperparameter(op, "beta1", beta1, beta1 >= 0 && beta1 < 1, "in [0, 1)");
  check_hyperparameter(op, "beta2", beta2, beta2 >= 0 && beta2 < 1, "in [0, 1)");
  check_hyperparameter(op, "eps", eps, eps >= 0, "finite and >= 0");
  check_hyperparameter(op, "weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  OCTET_CHECK(step >= 1, op,
              ": step must count updates from 1 (the bias corrections divide by 1 - beta^step), got ", step);

  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(step));
  with_update_types(param, grad, [&]<class T, class G>() {
    const cpu::AdamWConstants<T> c{
        .decay = static_cast<T>(1.0 - lr * weight_decay),
        .beta1 = static_cast<T>(beta1),
        .one_minus_beta1 = static_cast<T>(1.0 - beta1),
        .beta2 = static_cast<T>(beta2),
        .one_minus_beta2 = static_cast<T>(1.0 - beta2),
        .step_size = static_cast<T>(lr / bias_correction1),
        .bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2)),
        .eps = static_cast<T>(eps),
    };
    cpu::adamw_step<T, G>(param.data<T>(), static_cast<const G*>(grad.data_ptr()), exp_avg.data<T>(),
                          exp_avg_sq.data<T>(), param.numel(), c);
  });
}

void sgd_step_(const Tensor& param, const Tensor& grad, const Tensor& momentum_buffer, double lr,
               double momentum, double dampening, bool nesterov, double weight_decay, bool first_step) {
  const char* op = "sgd_step_";
  check_hyperparameter(op, "momentum", momentum, momentum >= 0, "finite and >= 0");
  if (momentum != 0) {
    OCTET_CHECK(momentum_buffer.defined(), op, ": momentum is ", momentum,
                " but momentum_buffer is undefined; allocate it with the param's shape and dtype");
    check_update_args(op, param, grad, {&momentum_buffer});
  } else {
    check_update_args(op, param, grad, {});
  }
  check_hyperparameter(op, "lr", lr, lr >= 0, "finite and >= 0");
  check_hyperparameter(op, "dampening", dampening, true, "finite");
  check_hyperparameter(op, "weight_decay", weight_decay, weight_decay >= 0, "finite and >= 0");
  OCTET_CHECK(!nesterov || (momentum > 0 && dampening == 0), op,
              ": nesterov needs momentum > 0 and dampening 0, got momentum ", momentum, " and dampening ",
              dampening);

  with_update_types(param, grad, [&]<class T, class G>() {
    const cpu::SgdConstants<T> c{
        .lr = static_cast<T>(lr),
        .momentum = static_cast<T>(momentum),
        .one_minus_dampening = static_cast<T>(1.0 - dampening),
        .weight_decay = static_cast<T>(weight_decay),
        .nesterov = nesterov,
        .first_step = first_step,
    };
    // With momentum 0 the buffer plays no part, even when the caller passed one.
    T* buffer = momentum != 0 ? momentum_buffer.data<T>() : nullptr;
    cpu::sgd_step<T, G>(param.data<T>(), static_cast<const G*>(grad.data_ptr()), buffer, param.numel(), c);
  });
}

double sum_of_squares(const Tensor& t) {
  const char* op = "sum_of_squares";
  check_defined(op, {&t});
  check_floating(op, t);
  check_cpu(op, {&t});
  if (t.dtype() == DType::f64) return cpu::sum_of_squares(t.data<double>(), t.numel());
  // Every other floating format widens to f32 exactly.
  const Tensor t32 = t.detach().to(DType::f32);
  return cpu::sum_of_squares(t32.data<float>(), t32.numel());
}

}  // namespace octet::kernels
