#pragma once
// The GPU's LayerNorm backward (layernorm_backward, add_layernorm_backward in kernels/nn_ops.h) for
// rows of 16-byte packs comes in two designs until a GPU run decides between them (bench_kernels
// times both; kernels/cuda/layernorm.cu describes them):
//   kRows     a warp per row, the row in registers; each warp adds its rows' dweight and dbias terms
//             into slots of its own in shared memory (the design measured at 0.62-0.64 of a copy);
//   kColumns  a block per run of rows, each thread owning 8 (16-bit) or 4 (f32) columns down the run:
//             a row's two sums are added across the block, and dweight and dbias stay in the
//             thread's registers, with no shared-memory traffic per element.
// dx, dweight and dbias are the same functions of the inputs either way, but added in another order
// (dx's row sums, and dweight's and dbias's runs of rows: 24 a block for ViT-H against 48), so the two
// designs' bits may differ in the last place. Each design repeats bit for bit, its bits depending on
// the values, the row count, the width and the dtypes alone. Where kColumns cannot take the rows
// (a width not a whole number of 16-byte packs or wider than 256 of them, a row not 16-byte aligned)
// the row design runs. Process-wide, kRows unless set; the CPU has one design.
#include <cstdint>

namespace octet::kernels {

enum class LayerNormBackwardDesign { kRows, kColumns };
void set_layernorm_backward_design(LayerNormBackwardDesign design);
LayerNormBackwardDesign layernorm_backward_design();

// How many times the column design's kernel was launched in this process (tests read it to prove it
// ran), and the launch's count.
int64_t layernorm_backward_column_launches();
void count_layernorm_backward_column_launch();

}  // namespace octet::kernels
