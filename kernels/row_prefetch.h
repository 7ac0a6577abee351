#pragma once
// Whether the GPU kernels that walk several rows (or tiles) per warp (or block) load the next one
// into the registers the current one has finished with (kRefill), or only once the current one is
// done (kAfter). The kernels that take it:
//   - LayerNorm's backward in the row design (kernels/cuda/layernorm.cu): a warp's next row, unit by
//     unit, as soon as its dx for that unit is written;
//   - LayerNorm writing FP8 (kernels/cuda/layernorm_fp8.cu), a warp per row: likewise, as soon as the
//     unit's output is computed;
//   - the tiled FP8 cast (kernels/cuda/fp8_cast_tiles.cuh: fp8_cast, fp8_cast_dbias, the GELU and
//     dGELU writing FP8): a block's next tile, row by row, as soon as the thread's values of that row
//     are computed.
// The third GPU run had LayerNorm's backward latency-bound in ncu (stalled on loads at 16 warps an SM)
// and the GELU casts at 0.67-0.73 of a copy. Each warp (block) loaded its row (tile), waited,
// computed and wrote, and only then asked for the next, so it had nothing in flight while it
// computed, and at their occupancy (16-24 warps an SM) too few loads were in flight for HBM.
// The refill reuses each unit's registers once the unit is done, so the occupancy stays (the plain
// cast aside: kernels/cuda/fp8_cast_tiles.cuh). The values, their order and the bits are the same
// either way; only when the loads are issued differs. Process-wide, kRefill unless set;
// bench_kernels times both until a GPU run decides. The CPU kernels have no such choice.
#include <cstdint>

namespace octet::kernels {

enum class RowPrefetch { kAfter, kRefill };
void set_row_prefetch(RowPrefetch prefetch);
RowPrefetch row_prefetch();

// How many launches in this process took a refilling kernel (tests read it to prove the switch
// reaches the kernels: none under kAfter), and the launch sites' count.
int64_t row_refill_launches();
void count_row_refill_launch();

}  // namespace octet::kernels
