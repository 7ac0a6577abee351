#pragma once
// Writing a differentiable function: compute the forward with kernels, then record() the outputs
// with a closure that maps output gradients to input gradients, side by side:
//
//   Tensor mul(const Tensor& a, const Tensor& b) {
//     const Tensor ad = a.detach(), bd = b.detach();
//     Tensor out = kernels::mul(ad, bd);
//     return record("mul", out, {a, b}, [ad, bd](const Grads& g) -> Grads {
//       return {kernels::sum_to(kernels::mul(g[0], bd), ad.shape()), kernels::sum_to(kernels::mul(g[0], ad), bd.shape())};
//     }, /*saved=*/{ad, bd});
//   }
//
// Rules for closures: capture tensors detached (a.detach()), never a recorded output itself (that
// would make the output own its own graph: a cycle). The closure gets one gradient per output —
// zeros where an output received none — and returns one per input, in the input's shape and dtype,
// or an undefined Tensor for inputs that need none. It runs with grad mode off.
//
// Name what the closure reads in `saved` (above: {ad, bd}). record() notes each one's storage version
// (Storage::version, which every in-place writer bumps), and the node checks them before the closure
// runs: a saved tensor written in place between forward and backward (y = exp(x); y.fill_(0);
// backward) is an error naming the op and the fix, where the closure would have read the new bytes
// and returned a wrong gradient without a word. PyTorch checks its saved variables the same way.
#include <functional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace octet::autograd {

using Grads = std::vector<Tensor>;
using BackwardFn = std::function<Grads(const Grads& grad_outputs)>;

// Attaches a backward node to `outputs` when grad mode is on and some input requires grad;
// otherwise returns them untouched (and the closure, with whatever it saved, is dropped).
std::vector<Tensor> record(std::string name, std::vector<Tensor> outputs, const std::vector<Tensor>& inputs,
                           BackwardFn backward, const std::vector<Tensor>& saved = {});
Tensor record(std::string name, Tensor output, const std::vector<Tensor>& inputs, BackwardFn backward,
              const std::vector<Tensor>& saved = {});

// True when an op on these inputs would record a node.
bool any_requires_grad(const std::vector<Tensor>& inputs);

}  // namespace octet::autograd
