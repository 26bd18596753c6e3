// The fabric phase (docs/FABRIC.md): every node publishes its RDMA inventory, node 0
// checks them against each other under launcher.fabric.require, and every node's job
// gets the NCCL and Gloo variables that follow from the plan.
#pragma once

#include <string>

#include "env/environment.h"
#include "env/identity.h"
#include "env/job_config.h"
#include "launcher/supervision/peers.h"
#include "rendezvous/fabric/nccl_env.h"
#include "rendezvous/fabric/plan.h"

namespace bt::launcher {

struct FabricResult {
  rendezvous::fabric::Inventory inventory;  // this node's
  // Node 0's verdict; its `nodes` hold every node's selection on node 0, and on the others
  // only their own (a selection follows from the node's own inventory), so that what node
  // 0 sends each node does not grow with the number of nodes.
  rendezvous::fabric::FabricPlan plan;
  rendezvous::fabric::NcclEnvironment nccl;  // this node's
  rendezvous::fabric::NcclConfigFiles nccl_config;  // NCCL's config files: their values are the user's
  rendezvous::fabric::GidPreferences gids;  // the job's NCCL_IB_ADDR_* (environment or config files)
  size_t rails_on_every_node = 0;            // the fewest selected ports any node has
};

// This node's devices, read before the rendezvous: the reads then overlap the wait for
// the other nodes instead of adding to the time after it.
rendezvous::fabric::Inventory ReadFabricInventory(const std::string& sysfs_root);

// Publishes `inventory` (with the interface that reached the leader), has node 0 plan, and
// exports the NCCL variables into `environment` (never over the user's). Throws
// LaunchFailure 69 with the mismatch table when the policy refuses the fabric. `peers` is
// null on a single node; without a store (mpi backend) each node plans for itself.
FabricResult PlanFabricPhase(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                             rendezvous::fabric::Inventory inventory, env::JobEnvironment& environment);

// Every node's plan as node 0 made it, from every node's published inventory: for
// `bt-launch rendezvous`, which shows them all. O(nodes) for each node that asks, so never
// on the way to the start commands.
rendezvous::fabric::FabricPlan ReadWholePlan(const env::JobConfig& config, Peers& peers, int node_count,
                                             const rendezvous::fabric::GidPreferences& gids);

// This node on its own, as `bt-launch fabric` shows it: nothing exported. Throws
// LaunchFailure 65 only on a malformed NCCL_IB_ADDR_* of the user's.
FabricResult InspectFabric(const env::JobConfig& config, const env::NodeIdentity& identity,
                           const std::string& sysfs_root, const env::JobEnvironment& environment);

// `bt-launch fabric`'s output: the inventory as ibstat shows it, the selection and the NCCL
// variables with their reasons; or one JSON object (devices, interfaces, selection, nccl_env).
std::string FormatFabricReport(const FabricResult& fabric, bool json);

// The mismatch table, or "" when there is none.
std::string DescribeMismatches(const rendezvous::fabric::FabricPlan& plan);

}  // namespace bt::launcher
