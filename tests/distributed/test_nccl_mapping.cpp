// What NcclProcessGroup asks NCCL for (distributed/nccl_reduction.h), checked on the host for every
// ReduceOp and dtype: at world size 1 each reduction returns its input, so the GPU tests there cannot
// tell a wrong operation or element type. And the rule behind the bf16/f16 average: sum, then divide
// by N in f32 and round once, which gives the correctly rounded quotient, where NCCL's own average
// (inputs scaled by 1/N rounded to the dtype) is biased. And ProcessGroup::split's color for
// ncclCommSplit, and whether ranks sharing a GPU are refused before NCCL is asked
// (distributed/nccl_shared_device.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "core/float_formats.h"
#include "distributed/nccl_reduction.h"
#include "distributed/nccl_shared_device.h"
#include "tests/testing.h"

namespace octet::distributed {
namespace {

struct Expected {
  ReduceOp op;
  DType dtype;
  ncclRedOp_t nccl_op;
  ncclDataType_t nccl_type;
  bool divide;
};

TEST(NcclMapping, EveryReducibleOpAndDtypeMapsToItsNcclCall) {
  const std::vector<Expected> table = {
      {ReduceOp::Sum, DType::f32, ncclSum, ncclFloat32, false},
      {ReduceOp::Avg, DType::f32, ncclAvg, ncclFloat32, false},
      {ReduceOp::Max, DType::f32, ncclMax, ncclFloat32, false},
      {ReduceOp::Sum, DType::f64, ncclSum, ncclFloat64, false},
      {ReduceOp::Avg, DType::f64, ncclAvg, ncclFloat64, false},
      {ReduceOp::Max, DType::f64, ncclMax, ncclFloat64, false},
      {ReduceOp::Sum, DType::bf16, ncclSum, ncclBfloat16, false},
      {ReduceOp::Avg, DType::bf16, ncclSum, ncclBfloat16, true},
      {ReduceOp::Max, DType::bf16, ncclMax, ncclBfloat16, false},
      {ReduceOp::Sum, DType::f16, ncclSum, ncclFloat16, false},
      {ReduceOp::Avg, DType::f16, ncclSum, ncclFloat16, true},
      {ReduceOp::Max, DType::f16, ncclMax, ncclFloat16, false},
      {ReduceOp::Sum, DType::i64, ncclSum, ncclInt64, false},
      {ReduceOp::Max, DType::i64, ncclMax, ncclInt64, false},
  };
  for (int world : {2, 3, 8}) {
    for (const Expected& e : table) {
      const NcclReduction r = nccl_reduction(e.op, e.dtype, world, "all_reduce");
      const std::string what =
          std::string(reduce_op_name(e.op)) + " of " + dtype_name(e.dtype) + " at " + std::to_string(world) + " ranks";
      EXPECT_EQ(r.op, e.nccl_op) << what;
      EXPECT_EQ(r.type, e.nccl_type) << what;
      EXPECT_EQ(r.divide_by_world_size, e.divide) << what;
    }
  }
}

// At one rank an average is its input: a plain sum (NCCL copies), never ncclAvg, whose one-rank kernel
// leaves the tail of an out-of-place call unwritten in NCCL up to 2.29.2 (distributed/nccl_reduction.h),
// and no division after it. Sum and Max are as at any world size; an i64 average is refused all the same.
TEST(NcclMapping, AnAverageAtOneRankIsAPlainSum) {
  for (DType d : {DType::f32, DType::f64, DType::bf16, DType::f16}) {
    const NcclReduction avg = nccl_reduction(ReduceOp::Avg, d, 1, "reduce_scatter");
    EXPECT_EQ(avg.op, ncclSum) << dtype_name(d);
    EXPECT_FALSE(avg.divide_by_world_size) << dtype_name(d);
    EXPECT_EQ(avg.type, nccl_reduction(ReduceOp::Sum, d, 2, "reduce_scatter").type) << dtype_name(d);
    EXPECT_EQ(nccl_reduction(ReduceOp::Max, d, 1, "reduce_scatter").op, ncclMax) << dtype_name(d);
    EXPECT_EQ(nccl_reduction(ReduceOp::Sum, d, 1, "reduce_scatter").op, ncclSum) << dtype_name(d);
  }
  EXPECT_TRUE(testing::throws_with([] { nccl_reduction(ReduceOp::Avg, DType::i64, 1, "all_reduce"); },
                                   {"all_reduce", "cannot average", "i64"}));
}

TEST(NcclMapping, DtypesNcclDoesNotReduceAreRefusedForEveryOp) {
  for (DType d : {DType::e4m3, DType::e5m2, DType::i32, DType::u8}) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
      EXPECT_TRUE(testing::throws_with([&] { nccl_reduction(op, d, 2, "reduce_scatter"); },
                                       {"reduce_scatter", dtype_name(d), "f32, f64, bf16, f16 or i64"}))
          << reduce_op_name(op) << " of " << dtype_name(d);
    }
  }
  EXPECT_TRUE(testing::throws_with([] { nccl_reduction(ReduceOp::Avg, DType::i64, 2, "all_reduce"); },
                                   {"all_reduce", "cannot average", "i64"}));
}

// ProcessGroup::split's colors as ncclCommSplit takes them: kNoColor must reach NCCL as
// NCCL_SPLIT_NOCOLOR, or the rank would join a group instead of getting none.
TEST(NcclMapping, SplitColorsReachNcclCommSplitAsTheyAre) {
  EXPECT_EQ(nccl_split_color(ProcessGroup::kNoColor), NCCL_SPLIT_NOCOLOR);
  for (int color : {0, 1, 7, 1 << 20}) EXPECT_EQ(nccl_split_color(color), color);
}

// The division the group runs after NCCL's sum (kernels::cuda::div_scalar_): x / float(N) in f32,
// rounded once to the dtype.
uint16_t divided(uint16_t bits, DType d, int n) {
  if (d == DType::bf16) return float_to_bf16_bits(bf16_bits_to_float(bits) / static_cast<float>(n));
  return float_to_f16_bits(f16_bits_to_float(bits) / static_cast<float>(n));
}
double value_of(uint16_t bits, DType d) {
  return d == DType::bf16 ? bf16_bits_to_float(bits) : f16_bits_to_float(bits);
}
uint16_t rounded(double x, DType d) { return d == DType::bf16 ? double_to_bf16_bits(x) : double_to_f16_bits(x); }

// Every finite bf16 and f16 value and world sizes up to 256 (up to 4096 holds too, at 16 times the
// time): the division gives the quotient rounded once from float64, subnormal ties of f16 included.
// Multiplying by 1/N rounded to f32 instead misses some f16 ties (x = 0x1.6cp-18, N = 14).
TEST(NcclMapping, DivisionAfterTheSumRoundsTheExactQuotientOnce) {
  for (DType d : {DType::bf16, DType::f16}) {
    int64_t wrong = 0;
    for (int n = 1; n <= 256; ++n) {
      for (uint32_t bits = 0; bits < 65536; ++bits) {
        const double x = value_of(static_cast<uint16_t>(bits), d);
        if (!std::isfinite(x)) continue;
        const uint16_t want = rounded(x / n, d);
        const uint16_t got = divided(static_cast<uint16_t>(bits), d, n);
        if (got != want && wrong++ < 5) {
          ADD_FAILURE() << dtype_name(d) << " " << x << " / " << n << ": got " << value_of(got, d) << ", want "
                        << value_of(want, d);
        }
      }
    }
    EXPECT_EQ(wrong, 0) << dtype_name(d);
  }
  const uint16_t tie = float_to_f16_bits(0x1.6cp-18f);
  EXPECT_EQ(divided(tie, DType::f16, 14), rounded(0x1.6cp-18 / 14, DType::f16));
  EXPECT_NE(float_to_f16_bits(f16_bits_to_float(tie) * static_cast<float>(1.0 / 14)), rounded(0x1.6cp-18 / 14, DType::f16));
}

// Why bf16 does not use ncclAvg: the mean of N random bf16 values per element, as NCCL's average
// computes it (each input times bf16(1/N), rounded to bf16, then summed) and as the group computes it
// (summed, then divided in f32), against the float64 mean. Summation order and its roundings are
// the same in both, so the difference is the scaling alone: for N = 3 bf16(1/3) is 0.2% high.
TEST(NcclMapping, SumThenDivideHasNoBiasWhereNcclsBf16AverageHas) {
  for (int n : {3, 5, 6, 7}) {
    const std::vector<double> x = testing::random_tensor({n, 4096}, DType::bf16, 500 + n).to_vector<double>();
    const float factor = bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(1.0 / n)));
    double bias_nccl_avg = 0, bias_divided = 0, scale = 0;
    for (int64_t j = 0; j < 4096; ++j) {
      double mean = 0;
      float sum = 0, scaled_sum = 0;
      for (int r = 0; r < n; ++r) {
        const float v = static_cast<float>(x[static_cast<size_t>(r * 4096 + j)]);
        mean += v;
        sum = bf16_bits_to_float(float_to_bf16_bits(sum + v));
        const float scaled = bf16_bits_to_float(float_to_bf16_bits(v * factor));
        scaled_sum = bf16_bits_to_float(float_to_bf16_bits(scaled_sum + scaled));
      }
      mean /= n;
      const double ours = bf16_bits_to_float(divided(float_to_bf16_bits(sum), DType::bf16, n));
      const double sign = mean < 0 ? -1.0 : 1.0;  // errors measured towards larger magnitude
      bias_nccl_avg += (scaled_sum - mean) * sign;
      bias_divided += (ours - mean) * sign;
      scale += std::abs(mean);
    }
    // The mean signed error relative to the mean magnitude: rounding to nearest even averages out
    // (about 1e-4 at most here), a scale that is off does not (bf16(1/N) is 0.1% to 0.2% off).
    EXPECT_LT(std::abs(bias_divided / scale), 3e-4) << "N = " << n;
    EXPECT_GT(std::abs(bias_nccl_avg / scale), 8e-4) << "N = " << n;
  }
}

// ---- several ranks on one GPU (distributed/nccl_shared_device.h) ----------------------------------

RankDevice gpu(uint64_t host, unsigned char id, int index) {
  RankDevice d;
  d.host = host;
  d.uuid.fill(0x5a);
  d.uuid[15] = id;
  d.index = index;
  return d;
}

// Sharing is the same host and the same UUID, whatever index each rank knows the GPU by
// (CUDA_VISIBLE_DEVICES renumbers); the same UUID on another host is another GPU.
TEST(NcclSharedDevice, RanksShareAGpuWhenHostAndUuidAgree) {
  const std::vector<RankDevice> one_per_rank = {gpu(1, 0, 0), gpu(1, 1, 1), gpu(2, 0, 0), gpu(2, 1, 1)};
  for (int r = 0; r < 4; ++r) EXPECT_EQ(ranks_sharing_device(one_per_rank, r), std::vector<int>{r});
  EXPECT_EQ(largest_device_sharing(one_per_rank).size(), 1u);

  const std::vector<RankDevice> all_on_gpu0 = {gpu(1, 0, 0), gpu(1, 0, 0), gpu(1, 0, 0), gpu(1, 0, 0)};
  EXPECT_EQ(ranks_sharing_device(all_on_gpu0, 2), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(largest_device_sharing(all_on_gpu0), (std::vector<int>{0, 1, 2, 3}));

  // Rank 3 sees GPU 0 as its cuda:0 under another CUDA_VISIBLE_DEVICES; ranks 1 and 2 are on GPU 1.
  const std::vector<RankDevice> mixed = {gpu(1, 0, 0), gpu(1, 1, 1), gpu(1, 1, 1), gpu(1, 0, 1), gpu(2, 0, 0)};
  EXPECT_EQ(ranks_sharing_device(mixed, 0), (std::vector<int>{0, 3}));
  EXPECT_EQ(ranks_sharing_device(mixed, 2), (std::vector<int>{1, 2}));
  EXPECT_EQ(ranks_sharing_device(mixed, 4), std::vector<int>{4});
  EXPECT_EQ(largest_device_sharing(mixed), (std::vector<int>{0, 3})) << "ties go to the lowest rank's GPU";
  EXPECT_EQ(describe_ranks({0, 3}), "ranks 0, 3");
  EXPECT_EQ(describe_ranks({0, 1}), "ranks 0, 1");
  EXPECT_EQ(describe_ranks({0, 1, 2, 3, 4, 5, 6, 7}), "ranks 0-7");
  EXPECT_EQ(describe_ranks({2}), "rank 2");
}

// NCCL_MULTI_RANK_GPU_ENABLE as NCCL reads it: strtoll, base 0; empty or unparsable is 0.
TEST(NcclSharedDevice, TheVariableIsReadAsNcclReadsIt) {
  EXPECT_FALSE(multi_rank_gpu_enabled(nullptr));
  EXPECT_FALSE(multi_rank_gpu_enabled(""));
  EXPECT_FALSE(multi_rank_gpu_enabled("0"));
  EXPECT_FALSE(multi_rank_gpu_enabled("0x0"));
  EXPECT_FALSE(multi_rank_gpu_enabled("yes")) << "strtoll reads no digits: NCCL's 0";
  EXPECT_TRUE(multi_rank_gpu_enabled("1"));
  EXPECT_TRUE(multi_rank_gpu_enabled("2"));
  EXPECT_TRUE(multi_rank_gpu_enabled("0x1"));
  EXPECT_TRUE(multi_rank_gpu_enabled("-1"));
}

// Below 2.30 NCCL refuses whatever the variable says; from 2.30 it accepts with the variable on. Each
// refusal names the ranks, the version, and the fixes: the variable, a newer NCCL, the MPI backend.
TEST(NcclSharedDevice, RefusalsNameTheVersionTheVariableAndTheFixes) {
  const std::string who = "ranks 0-3 share one GPU (cuda:0 of rank 0)";
  EXPECT_EQ(nccl_version_string(22809), "2.28.9");
  EXPECT_EQ(nccl_version_string(23007), "2.30.7");
  for (const char* value : {static_cast<const char*>(nullptr), "1"}) {
    const std::string old = nccl_shared_device_refusal(22809, value, who);
    for (const char* part : {"ranks 0-3 share one GPU", "2.28.9", "Duplicate GPU detected", "NCCL 2.30 or newer",
                             "NCCL_MULTI_RANK_GPU_ENABLE=1", "OCTET_BUNDLE_NCCL", "--dist-backend mpi"}) {
      EXPECT_NE(old.find(part), std::string::npos) << part << " not in: " << old;
    }
  }
  EXPECT_NE(nccl_shared_device_refusal(22907, "1", who), "") << "2.29.7 has no such switch";
  for (const char* value : {static_cast<const char*>(nullptr), "0", ""}) {
    const std::string off = nccl_shared_device_refusal(23007, value, who);
    for (const char* part : {"ranks 0-3 share one GPU", "NCCL 2.30.7", "mpirun -x NCCL_MULTI_RANK_GPU_ENABLE=1",
                             "Multiple Ranks are using the same GPU/Partition", "experimental", "NCCL_MAX_CTAS",
                             "--dist-backend mpi"}) {
      EXPECT_NE(off.find(part), std::string::npos) << part << " not in: " << off;
    }
    EXPECT_NE(off.find(value == nullptr ? "it is unset" : "it is '"), std::string::npos) << off;
  }
  EXPECT_EQ(nccl_shared_device_refusal(23000, "1", who), "");
  EXPECT_EQ(nccl_shared_device_refusal(23007, "1", who), "");
  EXPECT_EQ(nccl_shared_device_refusal(23203, "1", who), "");
}

}  // namespace
}  // namespace octet::distributed
