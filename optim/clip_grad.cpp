#include "optim/clip_grad.h"

#include <cmath>

#include "kernels/elementwise.h"
#include "kernels/optimizers.h"

namespace octet::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite) {
  OCTET_CHECK(std::isfinite(max_norm) && max_norm > 0,
              "clip_grad_norm_: max_norm must be finite and > 0, got ", max_norm,
              "; to train without clipping, do not call it");
  std::vector<Tensor> grads;
  for (const Tensor& p : params) {
    OCTET_CHECK(p.defined(), "clip_grad_norm_: a parameter is undefined; pass the model's tensors");
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  // One pass over all the gradients (one launch on a GPU) and one read of the total by the host.
  const double norm = grads.empty() ? 0.0 : std::sqrt(kernels::sum_of_squares_multi(grads));
  if (!std::isfinite(norm)) {
    OCTET_CHECK(!error_if_nonfinite, "clip_grad_norm_: the total gradient norm is ", norm,
                " (an inf or NaN gradient); lower the lr or enable loss scaling, or pass "
                "error_if_nonfinite = false to get the norm back and skip the step");
    return norm;
  }
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1.0) {
    for (const Tensor& g : grads) kernels::mul_scalar_(g, coef);
  }
  return norm;
}

}  // namespace octet::optim
