// The leader's view of the fabric: which ports each node would give NCCL, where nodes
// differ from the majority, and whether the job may start (launcher.fabric.require).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "env/job_config.h"
#include "rendezvous/fabric/gid.h"
#include "rendezvous/fabric/inventory.h"

namespace bt::rendezvous::fabric {

struct SelectedPort {
  std::string device;
  int port = 0;
  double rate_gbps = 0;
  std::string subnet_prefix;  // InfiniBand
  int gid_index = -1;         // RoCE: the GID NCCL would use (GidPreferences)
};

// The ports of one node NCCL should use: ACTIVE + LinkUp, verbs device accessible, one
// link layer (InfiniBand wins: Ethernet ports beside it are front-end or storage NICs),
// RoCE ports only where the GID NCCL will choose under `gids` (the job's NCCL_IB_ADDR_FAMILY,
// NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_RANGE) is one it can route with. Sorted by PCI address.
struct Selection {
  std::string link_layer;  // "InfiniBand", "Ethernet", or "" when the node has no usable RDMA port
  std::vector<SelectedPort> ports;
  std::vector<std::string> excluded;  // "mlx5_3:1 (DOWN/Polling)", one per port left out
};

Selection SelectPorts(const Inventory& inventory, const GidPreferences& gids = {});

struct NodeFabric {
  int rank = 0;
  std::string host;
  Inventory inventory;
};

// One line of the mismatch table.
struct Mismatch {
  int rank = 0;
  std::string host;
  std::string device;  // "-" for node-wide values
  std::string port;
  std::string what;
  std::string value;
  std::string majority;
};

struct NodePlan {
  int rank = 0;
  Selection selection;
  std::string summary;  // "8x InfiniBand 400 Gb/s" / "no RDMA"
};

struct FabricPlan {
  env::FabricRequirement policy = env::FabricRequirement::kAuto;  // after resolving auto
  bool ok = true;
  std::string failure;  // one line when !ok
  bool use_rdma = false;
  std::vector<Mismatch> mismatches;
  std::vector<std::string> warnings;
  std::vector<NodePlan> nodes;  // in rank order
  // How many nodes node 0 planned for, and how many of them have no usable RDMA port: the
  // plan node 0 shares with the others keeps these but not `nodes` (each node has its own).
  int node_count = 0;
  int nodes_without_rdma = 0;

  nlohmann::json ToJson() const;
  static FabricPlan FromJson(const nlohmann::json& json);  // throws InventoryError
  const NodePlan* ForRank(int rank) const;
  bool checked() const { return policy != env::FabricRequirement::kNone; }
  std::vector<int> RanksWithoutRdma() const;
};

// Compares every node with the majority and applies the policy. `auto` requires RDMA when
// any node has a usable port or an RDMA link that is up but unusable (an InfiniBand port
// in any state, a RoCE link up without a GID NCCL can use): present but broken hardware is
// a failure naming the ports, never a silent fall back to sockets.
FabricPlan PlanFabric(const std::vector<NodeFabric>& nodes, env::FabricRequirement required, const GidPreferences& gids = {});

std::string PolicyName(env::FabricRequirement requirement);
std::string FormatMismatches(const std::vector<Mismatch>& mismatches);

}  // namespace bt::rendezvous::fabric
