#include "nn/init.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <vector>

#include "core/grad_mode.h"
#include "nn/layers.h"

namespace octet::nn {

namespace {

thread_local bool skip_init = false;

// Writes host values into t, converting to its dtype and device once.
void assign(const Tensor& t, const std::vector<double>& values) {
  NoGradGuard no_grad;
  t.copy_(from_vector(values, t.shape(), DType::f64));
}

std::vector<double> draws(const Tensor& t, Generator& gen, bool normal) {
  OCTET_CHECK(t.defined() && is_floating(t.dtype()), "init: needs a defined floating tensor, got ",
              t.describe());
  const Tensor r = normal ? randn(t.shape(), gen, DType::f32) : rand(t.shape(), gen, DType::f32);
  return r.to_vector<double>();
}

double normal_cdf(double x) { return 0.5 * std::erfc(-x / std::numbers::sqrt2); }

// Φ⁻¹(p) for p in (0, 1): Acklam's rational approximation (relative error 1e-9), then one Halley
// step on Φ(x) - p, which brings it to double precision.
double normal_quantile(double p) {
  static const double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,  -2.759285104469687e+02,
                             1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static const double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                             6.680131188771972e+01, -1.328068155288572e+01};
  static const double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                             -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static const double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                             3.754408661907416e+00};
  const double p_low = 0.02425;
  double x;
  if (p < p_low) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - p_low) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log(1 - p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = normal_cdf(x) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

}  // namespace

void zeros_(const Tensor& t) { t.fill_(0.0); }
void ones_(const Tensor& t) { t.fill_(1.0); }

void uniform_(const Tensor& t, double low, double high, Generator& gen) {
  OCTET_CHECK(low <= high, "uniform_: low ", low, " is above high ", high, "; swap them");
  std::vector<double> v = draws(t, gen, false);
  for (double& x : v) x = low + (high - low) * x;
  assign(t, v);
}

void normal_(const Tensor& t, double mean, double std, Generator& gen) {
  OCTET_CHECK(std >= 0, "normal_: std must be non-negative, got ", std);
  std::vector<double> v = draws(t, gen, true);
  for (double& x : v) x = mean + std * x;
  assign(t, v);
}

void trunc_normal_(const Tensor& t, double mean, double std, double a, double b, Generator& gen) {
  OCTET_CHECK(std > 0 && a < b, "trunc_normal_: needs std > 0 and a < b, got std ", std, ", [", a, ", ", b,
              "]; a and b are absolute bounds, not multiples of std");
  const double cdf_a = normal_cdf((a - mean) / std), cdf_b = normal_cdf((b - mean) / std);
  OCTET_CHECK(cdf_b > cdf_a, "trunc_normal_: [", a, ", ", b, "] lies too far in the tail of Normal(", mean,
              ", ", std, ") to sample; move the bounds towards the mean");
  std::vector<double> v = draws(t, gen, false);
  const int64_t n = static_cast<int64_t>(v.size());
  // Each element depends on its own uniform only, so a static split over threads stays deterministic.
#pragma omp parallel for schedule(static) if (n > (1 << 15))
  for (int64_t i = 0; i < n; ++i) {
    // Keep p inside (0, 1): a uniform of exactly 0 would map to -inf before the clamp.
    const double p = std::clamp(cdf_a + (cdf_b - cdf_a) * v[i], 1e-300, 1 - 1e-16);
    v[i] = std::clamp(mean + std * normal_quantile(p), a, b);
  }
  assign(t, v);
}

void pytorch_default_init_(const Tensor& weight, const Tensor& bias, Generator& gen) {
  OCTET_CHECK(weight.defined() && weight.dim() >= 2 && weight.numel() > 0,
              "pytorch_default_init_: weight must be [out, in, ...] with elements, got ", weight.describe());
  const double fan_in = static_cast<double>(weight.numel() / weight.size(0));
  const double bound = 1.0 / std::sqrt(fan_in);
  uniform_(weight, -bound, bound, gen);
  if (bias.defined()) uniform_(bias, -bound, bound, gen);
}

void init_weights_vit_timm(Module& module, Generator& gen) {
  if (auto* linear = dynamic_cast<Linear*>(&module)) {
    trunc_normal_(linear->weight, 0.0, 0.02, gen);
    if (linear->bias.defined()) zeros_(linear->bias);
  } else if (auto* norm = dynamic_cast<LayerNorm*>(&module)) {
    norm->reset_parameters();
  } else if (auto* proj = dynamic_cast<PatchProjection*>(&module)) {
    proj->reset_parameters(gen);
  }
}

SkipInitGuard::SkipInitGuard() : previous_(skip_init) { skip_init = true; }
SkipInitGuard::~SkipInitGuard() { skip_init = previous_; }
bool init_enabled() { return !skip_init; }

}  // namespace octet::nn
