#pragma once
// The GPU's LayerNorm backward (layernorm_backward, add_layernorm_backward in kernels/nn_ops.h) for
// rows of 16-byte packs comes in two designs until a GPU run decides between them (bench_kernels
// times both; kernels/cuda/layernorm.cu describes them):
//   kRows     a warp per row, the row in registers; each warp adds its rows' dweight and dbias terms
//             into slots of its own in shared memory (the design measured at 0.62-0.64 of a copy);
//   kColumns  a block per run of rows, each thread owning 8 (16-bit) or 4 (f32) columns down the run:
//             a row's two sums are added across the block, and dweight and dbias stay in the
//             thread's registers, with no shared-memory traffic per element.
// dx is the same function of the inputs either way, but its row sums are added in another order, so
// the two designs' bits may differ in the last place; each design repeats bit for bit, and its bits
// depend on the row count and width alone. Process-wide, kRows unless set; the CPU has one design.
namespace octet::kernels {

enum class LayerNormBackwardDesign { kRows, kColumns };
void set_layernorm_backward_design(LayerNormBackwardDesign design);
LayerNormBackwardDesign layernorm_backward_design();

}  // namespace octet::kernels
