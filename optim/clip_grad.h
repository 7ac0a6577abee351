#pragma once
// Gradient-norm clipping, as torch.nn.utils.clip_grad_norm_.
#include <vector>

#include "core/tensor.h"

namespace octet::optim {

// The L2 norm of all the parameters' gradients together (as if concatenated), accumulated in double.
// When it exceeds max_norm, every gradient is scaled by max_norm / (norm + 1e-6) in place (PyTorch's
// rule). Returns the norm before clipping. Parameters whose grad is undefined are skipped.
//
// A non-finite norm (an inf or NaN gradient) is returned and the gradients are left as they are, so the
// caller can see it and skip the step; PyTorch would instead scale them into NaNs or zeros. With
// error_if_nonfinite it throws instead.
double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, bool error_if_nonfinite = false);

}  // namespace octet::optim
