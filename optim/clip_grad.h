#pragma once
// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_, computed where the gradients are: the
// total norm, the clip coefficient and the scaling all stay on their device, so a GPU step does not
// wait for the host to read the norm.
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace octet::optim {

// The total gradient norm clip_grad_norm_ returns: a one-element f64 tensor (shape []) on the
// gradients' device, as torch returns a tensor. Use it as a Tensor to keep it there. It also converts
// to double, implicitly so that `double norm = clip_grad_norm_(...)` keeps working; that conversion
// (or value()) reads it on the host, which on a GPU waits for the step's queued work: log it on log
// steps only.
class GradNorm : public Tensor {
 public:
  explicit GradNorm(Tensor norm) : Tensor(std::move(norm)) {}
  double value() const { return item(); }  // a host read (core/host_sync.h)
  operator double() const { return value(); }
};

// The L2 norm of all the parameters' gradients together (as if concatenated), accumulated in double.
// When it exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6) in place (PyTorch's
// rule, kernels::clip_coefficient). Returns the norm before clipping. Parameters whose grad is
// undefined are skipped. The sum of squares is one multi-tensor pass, the coefficient one tiny kernel
// and the scaling one multi-tensor pass (kernels/optimizers.h), all on the gradients' device: nothing
// is read on the host.
//
// A non-finite norm (an inf or NaN gradient) is returned and the gradients are left as they are, so the
// caller can see it and skip the step; PyTorch would instead scale them into NaNs or zeros. With
// error_if_nonfinite it throws instead, which needs the norm on the host: that reads it before the
// scaling, a host sync (on a GPU, a wait for the backward pass to finish).
GradNorm clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite = false);

// The second half of clip_grad_norm_, for callers that total the squares themselves (FSDP sums every
// rank's shards with an all-reduce): scales `grads` in place by the coefficient of the norm
// √sum_of_squares and returns that norm. sum_of_squares is a one-element f64 tensor on the gradients'
// device (kernels::sum_of_squares_multi_tensor's). `op` names the caller in errors.
GradNorm clip_grads_by_total_(const std::vector<Tensor>& grads, const Tensor& sum_of_squares, double max_norm,
                              bool error_if_nonfinite = false, const char* op = "clip_grad_norm_");

}  // namespace octet::optim
