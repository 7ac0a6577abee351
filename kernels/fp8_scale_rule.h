#pragma once
// The arithmetic of the FP8 scale updates (kernels/fp8.h), shared by the CPU and CUDA kernels so that
// both compute the same bits from the same source. Every step is one correctly rounded f32 operation
// (explicit _rn intrinsics on the device, so no compiler flag can change them); 2^margin comes in as an
// f32 computed once on the host.
#include <cfloat>

#include "core/hostdevice.h"

namespace octet::kernels {

OCTET_HD float fp8_div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The larger of two amaxes, NaN winning: a NaN anywhere in a history makes its Max amax NaN (and the
// scale is then kept). Which NaN wins does not matter, since no NaN reaches a scale.
OCTET_HD float fp8_amax_max(float a, float b) { return (a > b || a != a) ? a : b; }

// The scale for `amax`: fp8_max / amax / 2^margin, in f32 in that order. An amax that is 0 (or
// negative), inf or NaN keeps `previous_scale`; a scale that overflows to inf becomes FLT_MAX (a tiny
// amax, a denormal say, would otherwise give an infinite scale and a zero scale_inv).
OCTET_HD float fp8_scale_for_amax(float amax, float previous_scale, float fp8_max, float two_pow_margin) {
  if (!(amax > 0.f && amax <= FLT_MAX)) return previous_scale;  // NaN fails both comparisons
  const float scale = fp8_div_rn(fp8_div_rn(fp8_max, amax), two_pow_margin);
  return scale > FLT_MAX ? FLT_MAX : scale;
}

// scale_inv = 1 / scale, correctly rounded (a denormal for scales near FLT_MAX, kept as such).
OCTET_HD float fp8_scale_inv(float scale) { return fp8_div_rn(1.f, scale); }

}  // namespace octet::kernels
