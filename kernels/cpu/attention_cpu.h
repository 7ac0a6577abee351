#pragma once
// CPU attention backend: unfused, in the compute type T (float or double), over B·H independent heads
// stored contiguously. The entry points in kernels/attention.cpp check shapes and widen the inputs.
#include <cstdint>

namespace octet::kernels::cpu {

// q [BH, S, D], k and v [BH, Sk, D] -> out [BH, S, D] and lse [BH, S].
template <class T>
void attention_forward(const T* q, const T* k, const T* v, T* out, T* lse, int64_t bh, int64_t s, int64_t sk, int64_t d,
                       T scale);

// Gradients of out with respect to q, k and v given dout, recomputing the probabilities from lse.
template <class T>
void attention_backward(const T* dout, const T* q, const T* k, const T* v, const T* out, const T* lse, T* dq, T* dk,
                        T* dv, int64_t bh, int64_t s, int64_t sk, int64_t d, T scale);

}  // namespace octet::kernels::cpu
