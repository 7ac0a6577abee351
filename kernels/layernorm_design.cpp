// The GPU LayerNorm backward's design switch (kernels/layernorm_design.h).
#include "kernels/layernorm_design.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<LayerNormBackwardDesign> design{LayerNormBackwardDesign::kRows};
}  // namespace

void set_layernorm_backward_design(LayerNormBackwardDesign d) { design.store(d, std::memory_order_relaxed); }
LayerNormBackwardDesign layernorm_backward_design() { return design.load(std::memory_order_relaxed); }

}  // namespace octet::kernels
