#pragma once
// gradcheck: compares the gradients backward() computes with central finite differences, in f64.
//
// With random fixed projections r_k of the outputs, L(x) = Σ_k <f(x)_k, r_k>. backward() with
// output gradients r_k gives dL/dx analytically; (L(x + eps·e_j) − L(x − eps·e_j)) / 2eps gives it
// numerically for every element j of every input that requires grad. A random projection checks
// every output at once; a wrong Jacobian entry survives only by an exact cancellation.
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-6;
  double rtol = 1e-4;
  uint64_t seed = 20240;
};

struct GradcheckResult {
  bool ok = true;
  std::string message;  // the worst element per input, or what went wrong
  explicit operator bool() const { return ok; }
};

using MultiOutputFn = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
using SingleOutputFn = std::function<Tensor(const std::vector<Tensor>&)>;

// Inputs that require grad must be f64 leaves; so must every output that depends on them.
GradcheckResult gradcheck(const MultiOutputFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options = {});
GradcheckResult gradcheck(const SingleOutputFn& fn, const std::vector<Tensor>& inputs, GradcheckOptions options = {});

}  // namespace octet::autograd
