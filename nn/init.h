#pragma once
// Parameter initialisation, as torch.nn.init and timm's trunc_normal_. Every function writes the
// tensor in place (whatever its dtype and device) and draws from the Generator it is given, so a
// seeded generator gives identical weights run to run. Values are computed in f64 on the host and
// rounded once to the tensor's dtype.
#include "core/random.h"
#include "core/tensor.h"

namespace octet::nn {

class Module;

void zeros_(const Tensor& t);
void ones_(const Tensor& t);
void uniform_(const Tensor& t, double low, double high, Generator& gen);
void normal_(const Tensor& t, double mean, double std, Generator& gen);
// Normal(mean, std) restricted to [a, b], by inverting the CDF over [Φ(a), Φ(b)] as timm does.
// Note that a and b are absolute values, not multiples of std: timm's default ±2 with std 0.02
// truncates nothing in practice.
void trunc_normal_(const Tensor& t, double mean, double std, double a, double b, Generator& gen);
inline void trunc_normal_(const Tensor& t, double mean, double std, Generator& gen) {
  trunc_normal_(t, mean, std, -2.0, 2.0, gen);
}

// PyTorch's default for Linear and Conv2d, kaiming_uniform_(a = sqrt(5)): weight and bias uniform
// in ±1/sqrt(fan_in), fan_in = weight.numel() / weight.size(0) (in, or C·kh·kw for a conv).
void pytorch_default_init_(const Tensor& weight, const Tensor& bias, Generator& gen);

// timm's init_weights_vit_timm for one module (use with Module::apply): Linear weights
// trunc_normal(std 0.02), Linear biases zero, LayerNorm ones and zeros, and PatchEmbed's
// convolution PyTorch's Conv2d default. Other modules are left alone.
void init_weights_vit_timm(Module& module, Generator& gen);

// Inside this scope (per thread), layer constructors allocate their parameters and leave them
// uninitialised: for a model that initialises everything itself afterwards, is about to load a
// checkpoint, or is built only to count parameters (vit_huge in a test). PyTorch's skip_init.
class SkipInitGuard {
 public:
  SkipInitGuard();
  ~SkipInitGuard();
  SkipInitGuard(const SkipInitGuard&) = delete;
  SkipInitGuard& operator=(const SkipInitGuard&) = delete;

 private:
  bool previous_;
};
// False inside a SkipInitGuard: what layer constructors consult.
bool init_enabled();

}  // namespace octet::nn
