// main() for the GoogleTest programs that mpirun launches: see mpi_main.h.
#include "tests/distributed/mpi_main.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <memory>

#include "core/tensor.h"
#include "distributed/launch.h"
#include "tests/distributed/collective_testing.h"

namespace octet::testing {
namespace {

std::shared_ptr<distributed::ProcessGroup>& world_slot() {
  static std::shared_ptr<distributed::ProcessGroup> group;
  return group;
}

// Replaces GoogleTest's report on ranks other than 0: with N ranks, N copies of the same report
// would bury the one line that matters, a failure seen by only some ranks. So these ranks print
// only their failures, each naming the rank.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                 result.line_number(), result.message());
    std::fflush(stderr);
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (!info.result()->Failed()) return;
    std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
    std::fflush(stderr);
  }

 private:
  int rank_;
};

int run_tests_on_every_rank() {
  distributed::ProcessGroupOptions options;
  options.timeout = kCollectiveTimeout;
  world_slot() = distributed::init_process_group(collective_device(), distributed::Backend::Mpi, options);
  distributed::ProcessGroup& group = *world_slot();

  if (group.rank() != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(group.rank()));
  }

  const int64_t failed_here = RUN_ALL_TESTS() != 0 ? 1 : 0;

  // mpirun's exit status is the first non-zero one among the ranks, so every rank must learn
  // whether any rank failed: count the failing ranks on all of them.
  // On the group's device: a group of CUDA tensors (OCTET_TEST_DEVICE=cuda:0) refuses a CPU one.
  const Tensor failed_ranks = from_vector<int64_t>({failed_here}, {1}).to(group.device());
  group.all_reduce(failed_ranks, distributed::ReduceOp::Sum)->wait();
  const int64_t failures = failed_ranks.to(Device::cpu()).item<int64_t>();
  if (failures > 0 && group.rank() == 0) {
    std::fprintf(stderr, "%lld of %d ranks failed a test (each rank's failures are printed above)\n",
                 static_cast<long long>(failures), group.size());
  }

  // The group's communication thread must stop before MPI is finalised at exit.
  world_slot().reset();
  return failures > 0 ? 1 : 0;
}

}  // namespace

distributed::ProcessGroup& world() {
  OCTET_CHECK(world_slot() != nullptr, "octet::testing::world(): no process group; link tests/distributed/mpi_main.cpp "
              "and let its main() run the tests");
  return *world_slot();
}

std::shared_ptr<distributed::ProcessGroup> world_group() {
  return std::shared_ptr<distributed::ProcessGroup>(&world(), [](distributed::ProcessGroup*) {});
}

}  // namespace octet::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  // An exception outside a test (the group failing to start, say) ends the whole job naming this
  // rank, instead of leaving the other ranks in a collective.
  return octet::distributed::run_rank_main(octet::testing::run_tests_on_every_rank);
}
