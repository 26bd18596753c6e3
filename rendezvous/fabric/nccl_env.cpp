#include "rendezvous/fabric/nccl_env.h"

#include <set>
#include <stdexcept>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/node_info.h"

namespace bt::rendezvous::fabric {
namespace {

const Port* FindPort(const Inventory& inventory, const std::string& device_name, int number) {
  for (const Device& device : inventory.devices) {
    if (device.name != device_name) continue;
    for (const Port& port : device.ports) {
      if (port.number == number) return &port;
    }
  }
  return nullptr;
}

class Builder {
 public:
  explicit Builder(const VariableLookup& user_variable) : user_variable_(user_variable) {}

  void Offer(const std::string& name, const std::string& value, const std::string& reason) {
    if (auto own = user_variable_(name)) {
      result_.kept.push_back({name, *own, "set by the user (bt-launch would set " + value + ": " + reason + ")"});
      return;
    }
    result_.set.push_back({name, value, reason});
  }
  bool UserSet(const std::string& name) const { return user_variable_(name).has_value(); }
  NcclEnvironment Take() { return std::move(result_); }

 private:
  const VariableLookup& user_variable_;
  NcclEnvironment result_;
};

std::string HcaList(const Selection& selection) {
  std::string list = "=";
  for (const SelectedPort& port : selection.ports) {
    list += (list.size() > 1 ? "," : "") + port.device + ":" + std::to_string(port.port);
  }
  return list;
}

// NCCL 2.21 and later choose the RoCE GID themselves; older ones take index 0 unless told.
void OfferGidIndex(Builder& builder, const NodePlan& node, const Inventory& inventory, const VariableLookup& user_variable,
                   const VersionLookup& nccl_version) {
  if (builder.UserSet("NCCL_IB_GID_INDEX")) return;
  const std::optional<NcclVersion> version = nccl_version();
  if (!version || !version->Before(2, 21)) return;
  const GidPreferences preferences = GidPreferences::FromLookup(
      user_variable("NCCL_IB_ADDR_FAMILY"), user_variable("NCCL_IB_ROCE_VERSION_NUM"), user_variable("NCCL_IB_ADDR_RANGE"));
  std::set<int> indices;
  for (const SelectedPort& selected : node.selection.ports) {
    const Port* port = FindPort(inventory, selected.device, selected.port);
    if (port != nullptr) indices.insert(SelectGidIndex(*port, preferences));
  }
  if (indices.size() != 1) return;  // one variable for every port: only when they agree
  builder.Offer("NCCL_IB_GID_INDEX", std::to_string(*indices.begin()),
                "NCCL " + version->Text() + " predates automatic RoCE GID selection (2.21); the index NCCL 2.21 "
                "would choose (RoCE v2, IPv4)");
}

}  // namespace

NcclEnvironment ComputeNcclEnvironment(const FabricPlan& plan, const NodePlan& node, const Inventory& inventory,
                                       const VariableLookup& user_variable, const VersionLookup& nccl_version) {
  Builder builder(user_variable);
  if (!inventory.bootstrap_interface.empty()) {
    const std::string reason = "the interface this node reaches the leader from";
    builder.Offer("NCCL_SOCKET_IFNAME", "=" + inventory.bootstrap_interface, reason);
    builder.Offer("GLOO_SOCKET_IFNAME", inventory.bootstrap_interface, reason);  // Gloo matches the name exactly
  }
  if (!plan.checked()) return builder.Take();
  if (plan.use_rdma && !node.selection.ports.empty()) {
    std::string reason = std::to_string(node.selection.ports.size()) + " ACTIVE " + node.selection.link_layer +
                         " port(s) in PCI order";
    if (plan.node_count > 1 && plan.mismatches.empty()) reason += ", the same shape on all " + std::to_string(plan.node_count) + " nodes";
    if (!node.selection.excluded.empty()) {
      reason += "; left out:";
      for (const std::string& excluded : node.selection.excluded) reason += " " + excluded;
    }
    builder.Offer("NCCL_IB_HCA", HcaList(node.selection), reason);
    if (node.selection.link_layer == "Ethernet") OfferGidIndex(builder, node, inventory, user_variable, nccl_version);
  } else if (!plan.use_rdma) {
    builder.Offer("NCCL_IB_DISABLE", "1",
                  plan.nodes_without_rdma == plan.node_count ? "no node has a usable RDMA port: sockets"
                                : "not every node has usable RDMA and launcher.fabric.require is \"" + PolicyName(plan.policy) +
                                      "\": sockets, the same transport on every node");
  }
  return builder.Take();
}

nlohmann::json NcclEnvironmentToJson(const NcclEnvironment& environment) {
  nlohmann::json json = nlohmann::json::object();
  for (const NcclSetting& setting : environment.set) json[setting.name] = setting.value;
  for (const NcclSetting& setting : environment.kept) json[setting.name] = setting.value;
  return json;
}

}  // namespace bt::rendezvous::fabric
