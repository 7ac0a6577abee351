#pragma once
// HYBRID_SHARD's process groups (internal to distributed/fsdp*.cpp; train_vit logs the layout). A job
// of N ranks on nodes of G ranks: the parameters are sharded within a node and replicated across nodes.
//
//   shard groups      N / G groups of G consecutive ranks, {r : r / G = c}: one node each. They
//                     gather the units and reduce-scatter the gradients, as FULL_SHARD does over
//                     the whole job, so each rank holds 1/G of every flat parameter (padded to a
//                     multiple of G) and 16·Ψ/G bytes with AdamW.
//   replicate groups  G groups of N / G ranks, {r : r % G = c}: the ranks holding the same shard,
//                     one per node. After its reduce-scatter, each gradient shard is all-reduced
//                     (average) across them, so every replica steps the global-batch mean gradient.
//
// A gradient is averaged twice: over the G ranks of a node, then over the N / G nodes, which is the
// average over all N ranks. Only the small all-reduce of shards (1/G of the gradient) crosses nodes;
// the gathers and reduce-scatters, the large traffic, stay on the node's links.
#include <memory>
#include <string>
#include <vector>

#include "distributed/fsdp.h"
#include "distributed/process_group.h"

namespace octet::distributed::fsdp {

// Which ranks form the groups, from the sizes alone (a pure function, tested without ranks).
struct HybridLayout {
  int shard_group_size = 1, replicas = 1;  // G, and N / G
  int shard_color = 0, replicate_color = 0;  // this rank's groups: r / G and r % G
  std::vector<std::vector<int>> shard_groups, replicate_groups;  // every group's ranks, by color
};
// Throws, naming both numbers and the fix, unless 1 <= G and G divides N.
HybridLayout plan_hybrid_groups(int world_size, int rank, int shard_group_size);
// "2 shard groups of 2 ranks: {0,1} {2,3}; 2 replicate groups of 2 ranks: {0,2} {1,3}"
std::string describe(const HybridLayout& layout);

// The groups FSDP runs its collectives on.
struct FsdpGroups {
  std::shared_ptr<ProcessGroup> shard;      // gathers, reduce-scatters, the clip's sum of squares
  std::shared_ptr<ProcessGroup> replicate;  // the gradient shards' all-reduce; null but under HybridShard
};
// `world` itself under the other strategies. Under HybridShard, two splits of `world` (collectives
// over it), after the size check, which fails alike on every rank. `shard_group_size` 0 means the
// ranks of one node (launch_info().local_world_size).
FsdpGroups make_fsdp_groups(const std::shared_ptr<ProcessGroup>& world, ShardingStrategy sharding,
                            int shard_group_size);

}  // namespace octet::distributed::fsdp
