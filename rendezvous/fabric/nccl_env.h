// The NCCL and Gloo variables one node's job gets from the fabric plan
// (../shared/reference/ib-nccl.md §2.6; docs/FABRIC.md): only where the user has not set
// them, each with the reason it is set.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/fabric/inventory.h"
#include "rendezvous/fabric/nccl_library.h"
#include "rendezvous/fabric/plan.h"

namespace bt::rendezvous::fabric {

struct NcclSetting {
  std::string name;
  std::string value;
  std::string reason;
};

struct NcclEnvironment {
  std::vector<NcclSetting> set;   // to export
  std::vector<NcclSetting> kept;  // the user's own values, left alone (reason says what we would have set)
};

using VariableLookup = std::function<std::optional<std::string>(const std::string& name)>;
using VersionLookup = std::function<std::optional<NcclVersion>()>;

// `node` is this node's part of `plan`; `inventory` is this node's own (its GID tables and
// bootstrap interface). The NCCL version is asked only when RoCE needs it.
// Throws std::invalid_argument on a malformed NCCL_IB_ADDR_* variable of the user's.
NcclEnvironment ComputeNcclEnvironment(const FabricPlan& plan, const NodePlan& node, const Inventory& inventory,
                                       const VariableLookup& user_variable, const VersionLookup& nccl_version);

nlohmann::json NcclEnvironmentToJson(const NcclEnvironment& environment);

}  // namespace bt::rendezvous::fabric
