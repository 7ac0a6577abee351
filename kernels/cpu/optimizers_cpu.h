#pragma once
// CPU implementations behind kernels/optimizers.h. The entry points in kernels/optimizers.cpp have
// checked the arguments and turned the hyperparameters into the per-element constants below, so each
// loop here is a plain pass over contiguous buffers. T is the type the update computes in and the
// state's type (float or double); G is the gradient's storage type (T itself, bfloat16 or float16);
// L is the low-precision parameter that receives the updated T value rounded (bfloat16 or float16
// for a parameter with an f32 master copy; T with a null pointer when the parameter is T itself).
#include <cstdint>

namespace octet::kernels::cpu {

// The per-step constants, computed once in double by the entry point (the CUDA kernels take the
// same struct) and rounded once to the compute type with rounded_to<T>().
template <class T>
struct AdamWConstants {
  T decay;                  // 1 - lr·weight_decay
  T beta1, one_minus_beta1;
  T beta2, one_minus_beta2;
  T step_size;              // lr / (1 - beta1^step)
  T bias_correction2_sqrt;  // sqrt(1 - beta2^step)
  T eps;
};
template <class T>
AdamWConstants<T> rounded_to(const AdamWConstants<double>& c) {
  return {static_cast<T>(c.decay),     static_cast<T>(c.beta1),     static_cast<T>(c.one_minus_beta1),
          static_cast<T>(c.beta2),     static_cast<T>(c.one_minus_beta2), static_cast<T>(c.step_size),
          static_cast<T>(c.bias_correction2_sqrt), static_cast<T>(c.eps)};
}
// `rounded`, when non-null, receives each updated param[i] rounded to L (the bf16 working copy of
// an f32 master), in the same pass.
template <class T, class G, class L>
void adamw_step(T* param, const G* grad, T* exp_avg, T* exp_avg_sq, L* rounded, int64_t n,
                const AdamWConstants<T>& c);

template <class T>
struct SgdConstants {
  T lr, momentum, one_minus_dampening, weight_decay;
  bool nesterov;
  bool first_step;  // the momentum buffer is initialised to the first direction, not blended
};
template <class T>
SgdConstants<T> rounded_to(const SgdConstants<double>& c) {
  return {static_cast<T>(c.lr), static_cast<T>(c.momentum), static_cast<T>(c.one_minus_dampening),
          static_cast<T>(c.weight_decay), c.nesterov, c.first_step};
}
// buffer is null when momentum is 0; rounded as for adamw_step.
template <class T, class G, class L>
void sgd_step(T* param, const G* grad, T* buffer, L* rounded, int64_t n, const SgdConstants<T>& c);

template <class T>
double sum_of_squares(const T* x, int64_t n);

// x[i] ← S(C(x[i]) · scale) for storage type S and compute type C (float, or double for double).
template <class S, class C>
void scale(S* x, int64_t n, C scale);

}  // namespace octet::kernels::cpu
