#pragma once
// The shared main() of the GoogleTest programs that mpirun launches (label mpi), in mpi_main.cpp.
// Link mpi_main.cpp instead of gtest_main:
//
//   mpirun --oversubscribe -np 4 build/bin/test_collectives
//
// main initialises the job's process group (distributed::init_process_group with the MPI backend,
// on the CPU or on the device OCTET_TEST_DEVICE names: see collective_testing.h;
// a LocalProcessGroup of world size 1 when started without mpirun), runs every test on every rank
// in the same order, prints GoogleTest's report on rank 0 only (other ranks print just their own
// failures, prefixed with their rank), and exits non-zero on EVERY rank when any rank failed a test,
// so mpirun's exit status reflects a failure on any rank.
//
// Rules for tests in these programs, so that a failing rank never leaves the others waiting in a
// collective: issue the same collectives in the same order on every rank; never ASSERT (return
// early) between collectives, only EXPECT, and ASSERT only after a test's last collective. A rank
// that does stray ends the job after the group's timeout (kCollectiveTimeout below) instead of
// hanging it.
#include <chrono>
#include <memory>

#include "distributed/process_group.h"

namespace octet::testing {

// How long a collective may stay unfinished before the job is ended (ProcessGroupOptions::timeout).
// Every collective in these tests finishes in well under a second.
inline constexpr std::chrono::seconds kCollectiveTimeout{60};

// The job's process group, made by main before any test runs.
distributed::ProcessGroup& world();
// The same group as a handle for what takes one (DDP, FSDP). It does not own the group: main still
// ends it before MPI is finalised, whatever a test keeps.
std::shared_ptr<distributed::ProcessGroup> world_group();

}  // namespace octet::testing
