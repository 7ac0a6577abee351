// The MPI backend on CUDA tensors, with every rank on cuda:0 (label gpu):
//
//   mpirun -np 2 build/bin/test_gpu_shared_mpi
//
// NCCL before 2.30 takes one GPU per rank, so this is how several ranks share one GPU with any NCCL
// (test_nccl_ranks is the NCCL 2.30 way): MpiProcessGroup stages CUDA tensors through host memory.
// Each rank's input is drawn from a seed that names the rank, so every rank computes on the host, in
// f64, what all of them hold and what each collective must give.
//
// main() is tests/distributed/mpi_main.cpp's (it starts MPI and reports failures from every rank);
// these tests make their own group on cuda:0 beside its CPU world group. Started without mpirun
// they run at world size 1 on a LocalProcessGroup for cuda:0. Without a GPU every test skips.
// As mpi_main.h asks: the same collectives in the same order on every rank, and no ASSERT between
// collectives.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "distributed/launch.h"
#include "distributed/mpi_process_group.h"
#include "tests/cuda/cuda_testing.h"
#include "tests/distributed/mpi_main.h"
#include "tests/testing.h"

namespace octet {
namespace {

using distributed::ReduceOp;
using testing::kGpu;
using testing::same_bits;

const std::vector<int64_t> kSizes = {1, 7, 1001, 65537};
const std::vector<DType> kDtypes = {DType::f32, DType::bf16};
const std::vector<ReduceOp> kOps = {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max};

// Rank r's input for the test case `seed`: any rank can make any other rank's.
Tensor input_of(int rank, const Shape& shape, DType dtype, uint64_t seed) {
  return testing::random_tensor(shape, dtype, seed * 1000 + static_cast<uint64_t>(rank));
}

// op over the ranks, element by element, in f64 (Avg = the sum divided by the number of ranks).
std::vector<double> reduce_on_host(const std::vector<std::vector<double>>& per_rank, ReduceOp op) {
  std::vector<double> out = per_rank.front();
  for (size_t r = 1; r < per_rank.size(); ++r) {
    for (size_t i = 0; i < out.size(); ++i) {
      out[i] = op == ReduceOp::Max ? std::max(out[i], per_rank[r][i]) : out[i] + per_rank[r][i];
    }
  }
  if (op == ReduceOp::Avg) {
    for (double& v : out) v /= static_cast<double>(per_rank.size());
  }
  return out;
}

Tensor f64_tensor(const std::vector<double>& values) {
  return from_vector(values, {static_cast<int64_t>(values.size())}, DType::f64);
}

class SharedGpu : public ::testing::Test {
 protected:
  // One group for the suite, made at the same point on every rank (making an MPI group is itself
  // collective) and gone before MPI is finalised.
  static void SetUpTestSuite() {
    if (!cuda::is_available()) return;
    distributed::ProcessGroupOptions options;
    options.timeout = testing::kCollectiveTimeout;
    if (distributed::mpi_initialized()) {
      group_ = std::make_shared<distributed::MpiProcessGroup>(kGpu, options);
    } else {
      group_ = std::make_shared<distributed::LocalProcessGroup>(kGpu, options);
    }
  }
  static void TearDownTestSuite() { group_.reset(); }

  static distributed::ProcessGroup& group() { return *group_; }
  static int rank() { return group_->rank(); }
  static int world() { return group_->size(); }

  // Every rank's input for `seed`, as f64 values on the host.
  static std::vector<std::vector<double>> all_inputs(const Shape& shape, DType dtype, uint64_t seed) {
    std::vector<std::vector<double>> inputs;
    for (int r = 0; r < world(); ++r) inputs.push_back(input_of(r, shape, dtype, seed).to_vector<double>());
    return inputs;
  }

 private:
  static inline std::shared_ptr<distributed::ProcessGroup> group_;
};

TEST_F(SharedGpu, GroupSharesCuda0) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(group().device(), kGpu);
  EXPECT_EQ(group().size(), testing::world().size());
  EXPECT_EQ(group().rank(), testing::world().rank());
}

TEST_F(SharedGpu, AllReduceMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 1;
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kSizes) {
        ++seed;
        const Tensor tensor = input_of(rank(), {n}, dtype, seed).to(kGpu);
        group().all_reduce(tensor, op)->wait();
        const Tensor want = f64_tensor(reduce_on_host(all_inputs({n}, dtype, seed), op));
        EXPECT_LE(testing::relative_error_to_reference(tensor, want), testing::tolerance(dtype))
            << dtype_name(dtype) << " " << distributed::reduce_op_name(op) << " x" << n << " on rank " << rank();
      }
    }
  }
}

TEST_F(SharedGpu, AllGatherMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 100;
  for (DType dtype : kDtypes) {
    for (int64_t n : kSizes) {
      ++seed;
      std::vector<double> want;
      for (const std::vector<double>& input : all_inputs({n}, dtype, seed)) want.insert(want.end(), input.begin(), input.end());
      const Tensor input = input_of(rank(), {n}, dtype, seed).to(kGpu);

      const Tensor flat = full({n * world()}, -1.0, dtype, kGpu);
      group().all_gather(flat, input)->wait();
      EXPECT_TRUE(same_bits(flat, f64_tensor(want).to(dtype))) << dtype_name(dtype) << " x" << n << " on rank " << rank();

      std::vector<Tensor> list;
      for (int r = 0; r < world(); ++r) list.push_back(full({n}, -1.0, dtype, kGpu));
      group().all_gather(list, input)->wait();
      for (int r = 0; r < world(); ++r) {
        EXPECT_TRUE(same_bits(list[r], input_of(r, {n}, dtype, seed)))
            << dtype_name(dtype) << " x" << n << " from rank " << r << " into a list on rank " << rank();
      }
    }
  }
}

TEST_F(SharedGpu, ReduceScatterMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 200;
  for (DType dtype : kDtypes) {
    for (ReduceOp op : kOps) {
      for (int64_t n : kSizes) {
        ++seed;
        const Tensor output = full({n}, -1.0, dtype, kGpu);
        group().reduce_scatter(output, input_of(rank(), {n * world()}, dtype, seed).to(kGpu), op)->wait();
        const std::vector<double> reduced = reduce_on_host(all_inputs({n * world()}, dtype, seed), op);
        const std::vector<double> mine(reduced.begin() + rank() * n, reduced.begin() + (rank() + 1) * n);
        EXPECT_LE(testing::relative_error_to_reference(output, f64_tensor(mine)), testing::tolerance(dtype))
            << dtype_name(dtype) << " " << distributed::reduce_op_name(op) << " x" << n << " on rank " << rank();
      }
    }
  }
}

TEST_F(SharedGpu, BroadcastFromTheLastRank) {
  SKIP_WITHOUT_GPU();
  uint64_t seed = 300;
  const int root = world() - 1;  // not 0, so a root mix-up shows
  for (DType dtype : kDtypes) {
    for (int64_t n : kSizes) {
      ++seed;
      const Tensor tensor = input_of(rank(), {n}, dtype, seed).to(kGpu);
      group().broadcast(tensor, root)->wait();
      EXPECT_TRUE(same_bits(tensor, input_of(root, {n}, dtype, seed)))
          << dtype_name(dtype) << " x" << n << " on rank " << rank();
    }
  }
}

TEST_F(SharedGpu, CountersCountTheFullPayload) {
  SKIP_WITHOUT_GPU();
  group().reset_counters();
  const int64_t n = 1001;
  const Tensor input = input_of(rank(), {n}, DType::bf16, 400).to(kGpu);
  group().all_gather(empty({n * world()}, DType::bf16, kGpu), input)->wait();
  group().barrier()->wait();
  const distributed::CommCounters c = group().counters();
  EXPECT_EQ(c.payload_of(distributed::Collective::AllGather), 2 * n * world());
  EXPECT_DOUBLE_EQ(c.bus_bytes(distributed::Collective::AllGather),
                   2.0 * static_cast<double>(n) * (world() - 1));
  EXPECT_EQ(c.calls_of(distributed::Collective::Barrier), 1);
}

}  // namespace
}  // namespace octet
