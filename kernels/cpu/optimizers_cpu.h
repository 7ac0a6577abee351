#pragma once
// CPU implementations behind kernels/optimizers.h. The entry points in kernels/optimizers.cpp have
// checked the arguments and turned the hyperparameters into the per-element constants below, so each
// loop here is a plain pass over contiguous buffers. T is the parameter and state type (float or
// double); G is the gradient's storage type (T itself, or bfloat16 for float parameters).
#include <cstdint>

namespace octet::kernels::cpu {

template <class T>
struct AdamWConstants {
  T decay;                  // 1 - lr·weight_decay
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T step_size;              // lr / (1 - beta1^step)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  T eps;
};
template <class T, class G>
void adamw_step(T* param, const G* grad, T* exp_avg, T* exp_avg_sq, int64_t n, const AdamWConstants<T>& c);

template <class T>
struct SgdConstants {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer is initialised to the first direction, not blended
};
// buffer is null when momentum is 0.
template <class T, class G>
void sgd_step(T* param, const G* grad, T* buffer, int64_t n, const SgdConstants<T>& c);

template <class T>
double sum_of_squares(const T* x, int64_t n);

}  // namespace octet::kernels::cpu
