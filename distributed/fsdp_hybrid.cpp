// HYBRID_SHARD's process groups (distributed/fsdp_hybrid.h).
#include "distributed/fsdp_hybrid.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"
#include "distributed/launch.h"

namespace octet::distributed::fsdp {

HybridLayout plan_hybrid_groups(int world_size, int rank, int shard_group_size) {
  const int n = world_size, g = shard_group_size;
  OCTET_CHECK(g >= 1 && n % g == 0, "hybrid sharding: the world size ", n, " is not a multiple of the shard group "
              "size ", g, " (the ranks that shard among themselves, one node's); pass a shard group size that "
              "divides ", n, ", or start a multiple of ", g, " ranks");
  HybridLayout layout;
  layout.shard_group_size = g;
  layout.replicas = n / g;
  layout.shard_color = rank / g;
  layout.replicate_color = rank % g;
  layout.shard_groups.resize(static_cast<size_t>(n / g));
  layout.replicate_groups.resize(static_cast<size_t>(g));
  for (int r = 0; r < n; ++r) {
    layout.shard_groups[static_cast<size_t>(r / g)].push_back(r);
    layout.replicate_groups[static_cast<size_t>(r % g)].push_back(r);
  }
  return layout;
}

namespace {

// "{0,1} {2,3}"; past four groups of a large job, the first three, "…" and the last.
std::string groups_text(const std::vector<std::vector<int>>& groups) {
  const auto text = [](const std::vector<int>& group) { return fmt::format("{{{}}}", fmt::join(group, ",")); };
  std::vector<std::string> shown;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups.size() > 4 && g == 3) {
      shown.push_back("…");
      shown.push_back(text(groups.back()));
      break;
    }
    shown.push_back(text(groups[g]));
  }
  return fmt::format("{}", fmt::join(shown, " "));
}

}  // namespace

std::string describe(const HybridLayout& layout) {
  return fmt::format("{} shard groups of {} ranks: {}; {} replicate groups of {} ranks: {}", layout.shard_groups.size(),
                     layout.shard_group_size, groups_text(layout.shard_groups), layout.replicate_groups.size(),
                     layout.replicas, groups_text(layout.replicate_groups));
}

FsdpGroups make_fsdp_groups(const std::shared_ptr<ProcessGroup>& world, ShardingStrategy sharding,
                            int shard_group_size) {
  if (!is_hybrid(sharding)) return {world, nullptr};
  OCTET_CHECK(shard_group_size >= 0, "FullyShardedDataParallel: shard_group_size ", shard_group_size,
              " is negative; pass the ranks per shard group, or 0 for the ranks of one node");
  const int g = shard_group_size > 0 ? shard_group_size : launch_info().local_world_size;
  const HybridLayout layout = plan_hybrid_groups(world->size(), world->rank(), g);
  FsdpGroups groups;
  groups.shard = world->split(layout.shard_color, world->rank());
  groups.replicate = world->split(layout.replicate_color, world->rank());
  return groups;
}

}  // namespace octet::distributed::fsdp
