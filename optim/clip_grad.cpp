#include "optim/clip_grad.h"

#include <cmath>

#include "kernels/optimizers.h"

namespace octet::optim {

namespace {

void check_max_norm(const char* op, double max_norm) {
  OCTET_CHECK(std::isfinite(max_norm) && max_norm > 0, op, ": max_norm must be finite and > 0, got ", max_norm,
              "; to train without clipping, do not call it");
}

}  // namespace

GradNorm clip_grads_by_total_(const std::vector<Tensor>& grads, const Tensor& sum_of_squares, double max_norm,
                              bool error_if_nonfinite, const char* op) {
  check_max_norm(op, max_norm);
  const kernels::ClipScalars clip = kernels::clip_scalars(sum_of_squares, max_norm);
  if (error_if_nonfinite) {
    const double norm = clip.norm.item();  // the host read error_if_nonfinite needs
    OCTET_CHECK(std::isfinite(norm), op, ": the total gradient norm is ", norm,
                " (an inf or NaN gradient); lower the lr or enable loss scaling, or pass "
                "error_if_nonfinite = false to get the norm back and skip the step");
  }
  // A non-finite norm gives the coefficient 1, and a norm within max_norm too: the kernels then write
  // nothing, and the gradients stay as they are.
  kernels::scale_multi_(grads, clip.coef);
  return GradNorm(clip.norm);
}

GradNorm clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  check_max_norm("clip_grad_norm_", max_norm);
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    OCTET_CHECK(p.defined(), "clip_grad_norm_: a parameter is undefined; pass the model's tensors");
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // With no gradient at all the norm is 0, on the parameters' device.
  const Device device = !grads.empty() ? grads[0].device() : !params.empty() ? params[0].device() : Device::cpu();
  return clip_grads_by_total_(grads, kernels::sum_of_squares_multi_tensor(grads, device), max_norm,
                              error_if_nonfinite);
}

}  // namespace octet::optim
