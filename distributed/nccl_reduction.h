#pragma once
// What NcclProcessGroup asks NCCL for when it reduces: the NCCL operation and element type for a
// ReduceOp and a dtype, and whether the group divides the result by the world size afterwards; and
// the color it gives ncclCommSplit for ProcessGroup::split's.
// A pure function in a header, so a test checks every pair without a GPU: at world size 1 every
// reduction leaves its input as it was, so a wrong operation or type passes any value test there.
// CUDA builds only (it includes nccl.h).
//
// Averages. NCCL's ncclAvg on floating types multiplies each rank's input by 1/N rounded to the
// element type, then sums.
//   f32, f64: ncclAvg. The factor is off by at most half an ulp (2^-24 relative for f32, 2^-53 for
//     f64; exact when N is a power of two) and each product is rounded once more: errors of the order
//     of one rounding per rank, like the sum's own, and no pass over the tensor besides NCCL's.
//   bf16, f16: ncclSum, then the group divides by N in f32 and rounds once to the dtype
//     (kernels::cuda::div_scalar_ on the communication stream). ncclAvg would round 1/N to 8 or 11
//     bits (bf16(1/3) = 0.333984375, 0.2% high) and bias every average by up to 2^-9 for N = 3, 5,
//     6, 7, ..., and round each product to the 16-bit type as well.
//   At world size 1 an average is the input itself: ncclSum, which NCCL runs as a copy. NCCL's own
//     average at one rank runs a separate kernel that multiplies by 1/N = 1, and in NCCL up to 2.29.2
//     that kernel splits the elements among its blocks with a floor division, so an out-of-place call
//     (a reduce-scatter) leaves up to blocks - 1 elements of the tail unwritten: 100,003 f32 elements
//     over 25 blocks of 4,000 each miss the last 3. The test CudaNccl.ReduceScatterAndBroadcastAtOneRank
//     found it; NCCL 2.29.7 divides with rounding up.
// The MPI backend computes every average as sum, then division (distributed/mpi_process_group.cpp).
#include <nccl.h>

#include "core/dtype.h"
#include "core/error.h"
#include "distributed/process_group.h"

// ncclAvg and ncclBfloat16 arrived in NCCL 2.10, ncclCommSplit (ProcessGroup::split) in 2.18.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "Octet needs NCCL 2.18 or newer (ncclAvg, ncclBfloat16, ncclCommSplit); install a newer libnccl-dev"
#endif

namespace octet::distributed {

struct NcclReduction {
  ncclRedOp_t op = ncclSum;
  ncclDataType_t type = ncclFloat32;
  bool divide_by_world_size = false;  // after NCCL's sum: x / N in f32, rounded once to the dtype
};

// Throws an octet::Error naming `call` for a dtype NCCL does not reduce here (FP8, i32, u8: the
// same dtypes ProcessGroup refuses) and for an average of integers, at every world size.
inline NcclReduction nccl_reduction(ReduceOp op, DType dtype, int world_size, const char* call) {
  NcclReduction r;
  switch (dtype) {
    case DType::f32: r.type = ncclFloat32; break;
    case DType::f64: r.type = ncclFloat64; break;
    case DType::bf16: r.type = ncclBfloat16; break;
    case DType::f16: r.type = ncclFloat16; break;
    case DType::i64: r.type = ncclInt64; break;
    default:
      OCTET_FAIL(call, ": NCCL cannot reduce ", dtype_name(dtype),
                 " tensors; reductions take f32, f64, bf16, f16 or i64 (gather FP8 bytes, reduce in a wider dtype)");
  }
  switch (op) {
    case ReduceOp::Sum: r.op = ncclSum; return r;
    case ReduceOp::Max: r.op = ncclMax; return r;
    case ReduceOp::Avg:
      OCTET_CHECK(dtype != DType::i64, call, ": cannot average the integers of an i64 tensor; reduce with Sum and "
                  "divide, or average a floating copy");
      if (world_size == 1) {
        r.op = ncclSum;  // the input itself (see the top of the file)
      } else if (dtype == DType::bf16 || dtype == DType::f16) {
        r.op = ncclSum;
        r.divide_by_world_size = true;
      } else {
        r.op = ncclAvg;
      }
      return r;
  }
  OCTET_FAIL(call, ": unknown reduce op ", static_cast<int>(op));
}

// ncclCommSplit's color for split(color, key): NCCL_SPLIT_NOCOLOR (the rank gets no communicator)
// for ProcessGroup::kNoColor, the color itself otherwise (ProcessGroup::split has refused the
// other negative ones).
inline int nccl_split_color(int color) { return color == ProcessGroup::kNoColor ? NCCL_SPLIT_NOCOLOR : color; }

}  // namespace octet::distributed
