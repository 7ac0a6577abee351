// The GPU LayerNorm backward's design switch (kernels/layernorm_design.h).
#include "kernels/layernorm_design.h"

#include <atomic>

namespace octet::kernels {

namespace {
std::atomic<LayerNormBackwardDesign> design{LayerNormBackwardDesign::kRows};
std::atomic<int64_t> column_launches{0};
}  // namespace

void set_layernorm_backward_design(LayerNormBackwardDesign d) { design.store(d, std::memory_order_relaxed); }
LayerNormBackwardDesign layernorm_backward_design() { return design.load(std::memory_order_relaxed); }
int64_t layernorm_backward_column_launches() { return column_launches.load(std::memory_order_relaxed); }
void count_layernorm_backward_column_launch() { column_launches.fetch_add(1, std::memory_order_relaxed); }

}  // namespace octet::kernels
