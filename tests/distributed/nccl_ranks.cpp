// The NCCL backend at several ranks (label gpu): every collective at odd sizes, split, and FSDP's FP8
// all-gather, with values every rank checks against what it computes on the host.
//
//   NCCL_MULTI_RANK_GPU_ENABLE=1 mpirun -np 2 build/bin/test_nccl_ranks
//
// tests/cuda/test_cuda_nccl.cpp runs the NCCL group at world size 1, where every reduction is the
// identity and no offset or split can go wrong; these tests need ranks. Each rank takes its local
// rank's GPU, modulo the GPUs there are, so on a machine with one GPU every rank shares GPU 0: that
// needs NCCL 2.30 or newer with NCCL_MULTI_RANK_GPU_ENABLE=1 (distributed/nccl_shared_device.h), and
// tools/gpu_check.sh's nccl_ranks stage runs this at 2 ranks on one GPU. Without a GPU, or where the
// NCCL loaded would refuse the ranks on their GPUs, every test skips, saying why.
//
// main() is tests/distributed/mpi_main.cpp's: it starts MPI, its world group (MPI backend, CPU)
// reports failures from every rank. The NCCL group is made here, once, on every rank alike. Started
// without mpirun, the tests run at world size 1. As mpi_main.h asks: the same collectives in the same
// order on every rank, and no ASSERT between collectives.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "autograd/ops.h"
#include "core/tensor.h"
#include "distributed/ddp.h"
#include "distributed/fsdp.h"
#include "distributed/launch.h"
#include "distributed/nccl_process_group.h"
#include "nn/fp8.h"
#include "optim/optim.h"
#include "tests/distributed/collective_testing.h"
#include "tests/distributed/model_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::Collective;
using distributed::ProcessGroup;
using distributed::ReduceOp;
using testing::all_rank_inputs;
using testing::equals_exactly;
using testing::reduced_correctly;

// 100003 is prime and past NCCL's small-message protocols, so chunks split unevenly over channels.
const std::vector<int64_t> kSizes = {1, 7, 1001, 4099, 100003};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

class NcclRanks : public ::testing::Test {
 protected:
  // One group for the suite, made at the same point on every rank and gone before MPI is finalised.
  // The skip reason is the same on every rank: the shared-GPU check is collective.
  static void SetUpTestSuite() {
    if (!cuda::is_available()) {
      skip_ = "no CUDA device on this machine; this test runs on the GPU machine";
      return;
    }
    device_ = Device::cuda(distributed::launch_info().local_rank % cuda::device_count());
    const distributed::SharedGpuCheck shared = distributed::check_shared_gpu(device_);
    if (!shared.refusal.empty()) {
      skip_ = "the NCCL loaded would refuse these ranks: " + shared.refusal;
      return;
    }
    sharing_ = shared.who;
    distributed::ProcessGroupOptions options;
    options.timeout = testing::kCollectiveTimeout;
    group_ = distributed::init_process_group(device_, distributed::Backend::Nccl, options);
  }
  static void TearDownTestSuite() { group_.reset(); }

  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
  }

  static ProcessGroup& group() { return *group_; }
  static int rank() { return group_->rank(); }
  static int world() { return group_->size(); }
  static Device device() { return device_; }

  // Every rank's input for `salt` (on the host), and this rank's on its GPU.
  static std::vector<Tensor> inputs(const Shape& shape, DType dtype, uint64_t salt) {
    return all_rank_inputs(world(), shape, dtype, salt);
  }
  static Tensor mine(const std::vector<Tensor>& all) { return all[static_cast<size_t>(rank())].to(device()); }
  static Tensor sentinel(const Shape& shape, DType dtype) { return full(shape, -77.0, dtype, device()); }

  static inline std::string skip_, sharing_;
  static inline Device device_ = Device::cpu();
  static inline std::shared_ptr<ProcessGroup> group_;
};

TEST_F(NcclRanks, GroupIsTheJobsWorld) {
  EXPECT_EQ(group().backend(), "nccl");
  EXPECT_EQ(group().size(), testing::world().size());
  EXPECT_EQ(group().rank(), testing::world().rank());
  EXPECT_EQ(group().device(), device());
  if (rank() == 0) {
    std::printf("NCCL group of %d ranks: %s\n", world(), sharing_.empty() ? "one GPU each" : sharing_.c_str());
  }
}

TEST_F(NcclRanks, AllReduceEveryDtypeOpAndOddSize) {
  uint64_t salt = 1000;
  for (DType dtype : testing::kCollectiveDtypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : kOps) {
        if (op == ReduceOp::Avg && dtype == DType::i64) continue;  // refused: it would truncate
        const std::vector<Tensor> all = inputs({n}, dtype, ++salt);
        const Tensor tensor = mine(all);
        group().all_reduce(tensor, op)->wait();
        EXPECT_TRUE(reduced_correctly(tensor, all, 0, op))
            << testing::case_name(dtype, n, distributed::reduce_op_name(op));
      }
    }
  }
}

// Each rank's chunk of the reduction: the offsets are where a wrong chunk size or rank order shows.
TEST_F(NcclRanks, ReduceScatterGivesEachRankItsChunk) {
  uint64_t salt = 2000;
  for (DType dtype : testing::kFloatingDtypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : kOps) {
        const std::vector<Tensor> all = inputs({n * world()}, dtype, ++salt);
        const Tensor output = sentinel({n}, dtype);
        group().reduce_scatter(output, mine(all), op)->wait();
        EXPECT_TRUE(reduced_correctly(output, all, rank() * n, op))
            << testing::case_name(dtype, n, distributed::reduce_op_name(op));
      }
    }
  }
}

// FP8 moves as raw bytes: the gather FSDP's FP8 all-gather rests on, at odd byte counts.
TEST_F(NcclRanks, AllGatherFlatAndIntoAListFp8Included) {
  uint64_t salt = 3000;
  for (DType dtype : {DType::f32, DType::bf16, DType::f64, DType::e4m3, DType::e5m2}) {
    for (int64_t n : kSizes) {
      const std::vector<Tensor> all = inputs({n}, dtype, ++salt);
      const Tensor flat = sentinel({n * world()}, dtype);
      group().all_gather(flat, mine(all))->wait();
      std::vector<Tensor> list;
      for (int r = 0; r < world(); ++r) list.push_back(sentinel({n}, dtype));
      group().all_gather(list, mine(all))->wait();
      for (int r = 0; r < world(); ++r) {
        EXPECT_TRUE(equals_exactly(flat.narrow(r * n, n), all[static_cast<size_t>(r)]))
            << testing::case_name(dtype, n, "flat") << ", rank " << r << "'s chunk";
        EXPECT_TRUE(equals_exactly(list[static_cast<size_t>(r)], all[static_cast<size_t>(r)]))
            << testing::case_name(dtype, n, "list") << ", rank " << r << "'s tensor";
      }
    }
  }
}

TEST_F(NcclRanks, BroadcastFromEveryRoot) {
  uint64_t salt = 4000;
  for (DType dtype : {DType::f32, DType::bf16, DType::i64, DType::e4m3}) {
    for (int64_t n : kSizes) {
      for (int root = 0; root < world(); ++root) {
        const std::vector<Tensor> all = inputs({n}, dtype, ++salt);
        const Tensor tensor = mine(all);
        group().broadcast(tensor, root)->wait();
        EXPECT_TRUE(equals_exactly(tensor, all[static_cast<size_t>(root)]))
            << testing::case_name(dtype, n, "broadcast") << " from rank " << root;
      }
    }
  }
}

// ncclCommSplit, as hybrid sharding uses it: groups of consecutive ranks (pairs; at 2 ranks the
// whole world), groups of one, a group ranked in reverse by its key, and ranks that join none. Each
// subgroup's collectives give the values of its own members only, beside the world's in flight.
TEST_F(NcclRanks, SplitIntoPairsSingletonsAndReversedOrder) {
  const int n = world(), me = rank();
  const auto pairs = group().split(me / 2, me);
  const auto alone = group().split(me, 0);
  const auto reversed = group().split(0, n - me);
  const auto odd = group().split(me % 2 == 1 ? 0 : ProcessGroup::kNoColor, me);
  EXPECT_NE(pairs, nullptr);
  EXPECT_NE(alone, nullptr);
  EXPECT_NE(reversed, nullptr);
  EXPECT_EQ(odd == nullptr, me % 2 == 0);
  if (pairs == nullptr || alone == nullptr || reversed == nullptr) return;  // after every collective of the test
  const int pair_size = std::min(2, n - me / 2 * 2);
  EXPECT_EQ(pairs->size(), pair_size);
  EXPECT_EQ(pairs->rank(), me % 2);
  EXPECT_EQ(alone->size(), 1);
  EXPECT_EQ(reversed->size(), n);
  EXPECT_EQ(reversed->rank(), n - 1 - me);
  EXPECT_EQ(pairs->backend(), "nccl");

  const std::vector<Tensor> all = inputs({1001}, DType::f32, 5000);
  const Tensor in_pair = mine(all), by_myself = mine(all), in_world = mine(all);
  const auto pair_work = pairs->all_reduce(in_pair, ReduceOp::Sum);
  const auto alone_work = alone->all_reduce(by_myself, ReduceOp::Avg);
  const auto world_work = group().all_reduce(in_world, ReduceOp::Max);
  pair_work->wait(), alone_work->wait(), world_work->wait();
  std::vector<Tensor> pair_inputs;
  for (int r = me / 2 * 2; r < me / 2 * 2 + pair_size; ++r) pair_inputs.push_back(all[static_cast<size_t>(r)]);
  EXPECT_TRUE(reduced_correctly(in_pair, pair_inputs, 0, ReduceOp::Sum)) << "the pair's sum";
  EXPECT_TRUE(equals_exactly(by_myself, all[static_cast<size_t>(me)])) << "a group of one";
  EXPECT_TRUE(reduced_correctly(in_world, all, 0, ReduceOp::Max)) << "the world's max, beside the subgroups";

  // The reversed group gathers in its own rank order: world rank n-1 first.
  const Tensor gathered = sentinel({n * 7}, DType::bf16);
  const std::vector<Tensor> small = inputs({7}, DType::bf16, 5001);
  reversed->all_gather(gathered, mine(small))->wait();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(equals_exactly(gathered.narrow(r * 7, 7), small[static_cast<size_t>(n - 1 - r)])) << "chunk " << r;
  }
  // The odd ranks' group, where there is one: a reduce-scatter over its members.
  if (odd != nullptr) {
    const int m = odd->size();
    std::vector<Tensor> odd_inputs;
    const std::vector<Tensor> wide = inputs({m * 13}, DType::f32, 5002);
    for (int r = 1; r < n; r += 2) odd_inputs.push_back(wide[static_cast<size_t>(r)]);
    const Tensor out = sentinel({13}, DType::f32);
    odd->reduce_scatter(out, mine(wide), ReduceOp::Sum)->wait();
    EXPECT_TRUE(reduced_correctly(out, odd_inputs, odd->rank() * 13, ReduceOp::Sum)) << "the odd ranks' reduce-scatter";
  }
}

// FSDP's FP8 all-gather over NCCL (distributed/fsdp_fp8.h): the blocks' Linear weights gathered as
// E4M3 bytes, against the same model gathering them in bf16 and casting afterwards. Both forwards of
// the first step see the same E4M3 bytes, so the first loss is the same bits. After that, cuDNN's
// attention backward may add in a different order from run to run on a GPU, so the later losses and
// the parameters agree to a bound (a wrong offset or scale moves the loss by O(1)), and the gathers
// of the FP8 run move fewer bytes.
TEST_F(NcclRanks, FsdpFp8AllGatherMatchesBf16Gathers) {
  const models::ViTConfig config = testing::tiny_vit_config("nccl_fp8", /*embed_dim=*/16, /*depth=*/3);
  const testing::SeededBatches batches{.image_seed = 7000, .label_stride = 3, .label_step = 1};
  struct Run {
    std::vector<float> losses;
    std::vector<std::pair<std::string, Tensor>> parameters;
    int64_t gathered_bytes = 0;
  };
  auto train = [&](bool fp8_all_gather) {
    auto model = testing::make_vit(config, 31);
    model->to(device());
    distributed::FullyShardedDataParallel fsdp(
        model, group_,
        {.sharding = distributed::ShardingStrategy::FullShard,
         .flat_param_key = [](const std::string& name, const Tensor& p) {
           return optim::is_weight_decayed(name, p) ? 1 : 0;
         },
         .compute_dtype = DType::bf16,
         .fp8_all_gather = fp8_all_gather});
    optim::AdamW opt(fsdp.parameters(), 3e-3, 0.9, 0.999, 1e-8, 0.05);
    Run run;
    group().reset_counters();
    for (int step = 0; step < 4; ++step) {
      const testing::Batch b = batches.global_batch(2 * world(), step).shard(rank(), 2);
      Tensor loss;
      {
        nn::Fp8Autocast fp8(true, nn::DelayedScaling{}, distributed::fp8_amax_reducer(group_));
        loss = cross_entropy(fsdp(b.images.to(device()).to(DType::bf16)), b.labels.to(device()));
      }
      loss.backward();
      run.losses.push_back(static_cast<float>(loss.item()));
      opt.step(), opt.zero_grad();
    }
    run.gathered_bytes = group().counters().payload_of(Collective::AllGather);
    run.parameters = fsdp.full_parameters();
    return run;
  };
  const Run bf16 = train(false), fp8 = train(true);
  ASSERT_EQ(bf16.losses.size(), fp8.losses.size());
  EXPECT_EQ(bf16.losses[0], fp8.losses[0]) << "the first forward sees the same E4M3 weights";
  for (size_t s = 0; s < bf16.losses.size(); ++s) {
    EXPECT_NEAR(fp8.losses[s], bf16.losses[s], 1e-2 * std::abs(bf16.losses[s])) << "step " << s;
  }
  ASSERT_EQ(bf16.parameters.size(), fp8.parameters.size());
  double worst = 0;
  for (size_t i = 0; i < bf16.parameters.size(); ++i) {
    const std::vector<double> a = bf16.parameters[i].second.to_vector<double>();
    const std::vector<double> b = fp8.parameters[i].second.to_vector<double>();
    for (size_t j = 0; j < a.size(); ++j) {
      worst = std::max(worst, std::abs(a[j] - b[j]) / std::max(1.0, std::abs(a[j])));
    }
  }
  EXPECT_LT(worst, 2e-2) << "largest relative parameter difference after 4 steps";
  EXPECT_LT(fp8.gathered_bytes, bf16.gathered_bytes * 3 / 4) << "E4M3 gathers move 1 byte per weight element, not 2";
}

}  // namespace
}  // namespace octet
