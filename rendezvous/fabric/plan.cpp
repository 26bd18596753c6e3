#include "rendezvous/fabric/plan.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/node_info.h"

namespace bt::rendezvous::fabric {
namespace {

constexpr const char* kNoRdma = "none";

std::string PortName(const std::string& device, int port) { return device + ":" + std::to_string(port); }

std::string FormatRate(double gbps) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", gbps);
  return text;
}

// The most frequent value; a tie goes to the one seen first (lowest rank).
template <typename T>
T Majority(const std::vector<T>& values) {
  std::map<T, int> counts;
  for (const T& value : values) ++counts[value];
  T best = values.front();
  for (const T& value : values) {
    if (counts[value] > counts[best]) best = value;
  }
  return best;
}

bool HasUsableInfiniBand(const Inventory& inventory) {
  for (const Device& device : inventory.devices) {
    for (const Port& port : device.ports) {
      if (port.IsInfiniBand() && port.Usable() && device.uverbs_accessible) return true;
    }
  }
  return false;
}

// " (it has RoCE v2 IPv6 GIDs: NCCL_IB_ADDR_FAMILY=AF_INET6)" when the port would be usable
// with the other address family: the fix for an IPv6-only (or IPv4-only) RoCE fabric.
std::string OtherFamilyHint(const Port& port, const GidPreferences& gids) {
  GidPreferences other = gids;
  other.family = gids.family == AF_INET ? AF_INET6 : AF_INET;
  other.range.clear();
  if (FindUsableGid(port, other) == nullptr) return "";
  return " (it has " + other.Describe() + " GIDs: NCCL_IB_ADDR_FAMILY=" + (other.family == AF_INET ? "AF_INET" : "AF_INET6") + ")";
}

// Why a port cannot carry RDMA; "" when it can.
std::string PortFault(const Device& device, const Port& port, const GidPreferences& gids) {
  if (port.state == kPortInit && port.phys_state == kPhysLinkUp) return "state INIT/LinkUp: no subnet manager configured it";
  if (!port.Usable()) return "state " + port.state_name + "/" + port.phys_state_name;
  if (!device.uverbs_accessible) return "verbs device not accessible";
  if (!port.IsInfiniBand() && FindUsableGid(port, gids) == nullptr) return "no " + gids.Describe() + " GID" + OtherFamilyHint(port, gids);
  return "";
}

// A port meant for NCCL's IB transport that cannot carry it: an InfiniBand port in any state
// (InfiniBand carries nothing else), or a RoCE link that is up without a GID NCCL can use.
// A down Ethernet port is only an unused NIC.
bool BrokenRdmaPort(const Device& device, const Port& port, const GidPreferences& gids) {
  if (PortFault(device, port, gids).empty()) return false;
  return port.IsInfiniBand() || port.Usable();
}

bool HasBrokenRdmaPort(const Inventory& inventory, const GidPreferences& gids) {
  for (const Device& device : inventory.devices) {
    for (const Port& port : device.ports) {
      if (BrokenRdmaPort(device, port, gids)) return true;
    }
  }
  return false;
}

std::string Summary(const Selection& selection) {
  if (selection.link_layer.empty()) return "no RDMA";
  std::vector<double> rates;
  for (const SelectedPort& port : selection.ports) rates.push_back(port.rate_gbps);
  const std::string layer = selection.link_layer == "InfiniBand" ? "InfiniBand" : "RoCE";
  return std::to_string(selection.ports.size()) + "x " + layer + " " + FormatRate(Majority(rates)) + " Gb/s";
}

class Checker {
 public:
  Checker(const std::vector<NodeFabric>& nodes, std::vector<Selection> selections, const GidPreferences& gids)
      : nodes_(nodes), selections_(std::move(selections)), gids_(gids) {}

  std::vector<Mismatch> Run() {
    std::vector<std::string> layers;
    for (const Selection& selection : selections_) layers.push_back(LayerOf(selection));
    layer_ = Majority(layers);
    for (size_t i = 0; i < nodes_.size(); ++i) CheckLayer(i);
    if (layer_ == kNoRdma) {
      // Sockets for everyone: every RDMA port that is there but cannot be used is named,
      // so that a fabric whose subnet manager is down never looks like one without RDMA.
      for (size_t i = 0; i < nodes_.size(); ++i) AddFaultyPorts(i, "");
    } else {
      CheckPortCounts();
      CheckRates();
      if (layer_ == "InfiniBand") CheckSubnetPrefixes();
    }
    CheckBootstrapInterfaces();
    CheckDuplicateGuids();
    return std::move(rows_);
  }

  const std::string& majority_layer() const { return layer_; }

 private:
  static std::string LayerOf(const Selection& selection) {
    return selection.link_layer.empty() ? kNoRdma : selection.link_layer;
  }

  void Add(size_t node, const std::string& device, const std::string& port, const std::string& what,
           const std::string& value, const std::string& majority) {
    rows_.push_back({nodes_[node].rank, nodes_[node].host, device, port, what, value, majority});
  }

  // Each port of `layer` ("" = any) that could not be selected, with its fault.
  void AddFaultyPorts(size_t node, const std::string& layer) {
    for (const Device& device : nodes_[node].inventory.devices) {
      for (const Port& port : device.ports) {
        if (!layer.empty() && port.link_layer != layer) continue;
        const std::string fault = PortFault(device, port, gids_);
        if (!fault.empty()) Add(node, device.name, std::to_string(port.number), "port", fault, "usable");
      }
    }
  }

  void CheckLayer(size_t node) {
    const std::string layer = LayerOf(selections_[node]);
    if (layer == layer_) return;
    Add(node, "-", "-", "link layer", layer, layer_);
    if (layer_ != kNoRdma) AddFaultyPorts(node, layer_);
  }

  void CheckPortCounts() {
    std::vector<size_t> counts;
    for (const Selection& selection : selections_) {
      if (LayerOf(selection) == layer_) counts.push_back(selection.ports.size());
    }
    const size_t majority = Majority(counts);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (LayerOf(selections_[i]) != layer_ || selections_[i].ports.size() == majority) continue;
      Add(i, "-", "-", "usable ports", std::to_string(selections_[i].ports.size()), std::to_string(majority));
      AddFaultyPorts(i, layer_);
    }
  }

  void CheckRates() {
    std::vector<double> rates;
    for (const Selection& selection : selections_) {
      for (const SelectedPort& port : selection.ports) rates.push_back(port.rate_gbps);
    }
    if (rates.empty()) return;
    const double majority = Majority(rates);
    for (size_t i = 0; i < nodes_.size(); ++i) {
      for (const SelectedPort& port : selections_[i].ports) {
        if (port.rate_gbps != majority) {
          Add(i, port.device, std::to_string(port.port), "rate Gb/s", FormatRate(port.rate_gbps), FormatRate(majority));
        }
      }
    }
  }

  // Rail r is each node's r-th port in PCI order: NCCL pairs NICs that way.
  void CheckSubnetPrefixes() {
    size_t rails = 0;
    for (const Selection& selection : selections_) rails = std::max(rails, selection.ports.size());
    for (size_t rail = 0; rail < rails; ++rail) {
      std::vector<std::string> prefixes;
      for (const Selection& selection : selections_) {
        if (rail < selection.ports.size()) prefixes.push_back(selection.ports[rail].subnet_prefix);
      }
      const std::string majority = Majority(prefixes);
      for (size_t i = 0; i < nodes_.size(); ++i) {
        if (rail >= selections_[i].ports.size()) continue;
        const SelectedPort& port = selections_[i].ports[rail];
        if (port.subnet_prefix != majority) {
          Add(i, port.device, std::to_string(port.port), "subnet prefix (rail " + std::to_string(rail) + ")",
              port.subnet_prefix, majority);
        }
      }
    }
  }

  // NCCL bootstraps over NCCL_SOCKET_IFNAME: a node on loopback while others are not
  // (node 0 whose own name resolves to 127.0.1.1) publishes an address no other host reaches.
  void CheckBootstrapInterfaces() {
    std::optional<size_t> routable;  // the first node that bootstraps over a routable interface
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const Inventory& inventory = nodes_[i].inventory;
      if (inventory.bootstrap_interface.empty()) {
        Add(i, "-", "-", "bootstrap interface", "none reaches the leader", "an interface");
      } else if (!routable && !IsLoopbackInterface(inventory.interfaces, inventory.bootstrap_interface)) {
        routable = i;
      }
    }
    if (!routable) return;  // every node on loopback: they share one host
    for (size_t i = 0; i < nodes_.size(); ++i) {
      const Inventory& inventory = nodes_[i].inventory;
      if (inventory.bootstrap_interface.empty() || !IsLoopbackInterface(inventory.interfaces, inventory.bootstrap_interface)) continue;
      Add(i, "-", "-", "bootstrap interface", inventory.bootstrap_interface + " (loopback)",
          "routable, as " + nodes_[*routable].inventory.bootstrap_interface + " on node " + std::to_string(nodes_[*routable].rank));
    }
  }

  // Cloned VM images keep their GUIDs: two nodes with one GUID confuse the subnet manager.
  // An all-zero GUID is no identity at all (a virtual function nobody has given a GUID):
  // it names nothing that could clash.
  void CheckDuplicateGuids() {
    std::map<std::string, int> first_rank;
    for (size_t i = 0; i < nodes_.size(); ++i) {
      for (const Device& device : nodes_[i].inventory.devices) {
        if (device.node_guid.empty() || IsZeroGid(device.node_guid)) continue;
        auto [it, inserted] = first_rank.emplace(device.node_guid, nodes_[i].rank);
        if (!inserted && it->second != nodes_[i].rank) {
          Add(i, device.name, "-", "node GUID", device.node_guid, "unique (also on node " + std::to_string(it->second) + ")");
        }
      }
    }
  }

  const std::vector<NodeFabric>& nodes_;
  std::vector<Selection> selections_;
  const GidPreferences& gids_;
  std::string layer_;
  std::vector<Mismatch> rows_;
};

void ApplyPolicy(FabricPlan& plan, const std::string& majority_layer, env::FabricRequirement requested) {
  const std::vector<int> without = plan.RanksWithoutRdma();
  const std::string require = "launcher.fabric.require is \"" + PolicyName(requested) + "\"";
  if (plan.policy == env::FabricRequirement::kIb) {
    if (majority_layer == kNoRdma && without.size() == plan.nodes.size()) {
      plan.ok = false;
      plan.failure = plan.mismatches.empty()
                         ? "no node has a usable RDMA port, and " + require
                         : "no node has a usable RDMA port, though RDMA ports are present (the table below "
                               "names them), and " + require +
                               ": repair them, or set launcher.fabric.require to \"any\" to run NCCL over sockets";
    } else if (!plan.mismatches.empty()) {
      plan.ok = false;
      plan.failure = "the fabric differs between nodes (" + std::to_string(plan.mismatches.size()) +
                     " differences below) and " + require + "; set it to \"any\" to start anyway";
    }
    plan.use_rdma = plan.ok;
    return;
  }
  // any: RDMA when every node has it, sockets everywhere otherwise.
  if (without.size() == plan.nodes.size()) {
    plan.use_rdma = false;  // a cluster without RDMA (or CPU training): sockets are expected
    if (!plan.mismatches.empty()) {
      plan.warnings.push_back("no node has a usable RDMA port, though RDMA ports are present (the table names "
                              "them): NCCL uses sockets (TCP) on every node, which is much slower");
    }
    return;
  } else if (!without.empty()) {
    plan.use_rdma = false;
    plan.warnings.push_back("node" + std::string(without.size() > 1 ? "s " : " ") + FormatRanks(without) +
                            (without.size() > 1 ? " have" : " has") +
                            " no usable RDMA port: NCCL uses sockets (TCP) on every node, which is much slower");
  } else {
    plan.use_rdma = majority_layer != kNoRdma;
  }
  if (!plan.mismatches.empty()) {
    plan.warnings.push_back("the fabric differs between nodes (" + std::to_string(plan.mismatches.size()) +
                            " differences); launcher.fabric.require is \"any\", so the job starts");
  }
}

}  // namespace

Selection SelectPorts(const Inventory& inventory, const GidPreferences& gids) {
  Selection selection;
  selection.link_layer = HasUsableInfiniBand(inventory) ? "InfiniBand" : "";
  if (selection.link_layer.empty()) {
    for (const Device& device : inventory.devices) {
      for (const Port& port : device.ports) {
        if (!port.IsInfiniBand() && PortFault(device, port, gids).empty()) selection.link_layer = "Ethernet";
      }
    }
  }
  for (const Device& device : inventory.devices) {
    for (const Port& port : device.ports) {
      const std::string name = PortName(device.name, port.number);
      if (!selection.link_layer.empty() && port.link_layer != selection.link_layer) {
        selection.excluded.push_back(name + " (" + port.link_layer + " beside " + selection.link_layer + ")");
        continue;
      }
      if (const std::string fault = PortFault(device, port, gids); !fault.empty()) {
        selection.excluded.push_back(name + " (" + fault + ")");
        continue;
      }
      const Gid* gid = port.IsInfiniBand() ? nullptr : FindUsableGid(port, gids);
      selection.ports.push_back({device.name, port.number, port.rate_gbps, port.SubnetPrefix(), gid ? gid->index : -1});
    }
  }
  return selection;
}

FabricPlan PlanFabric(const std::vector<NodeFabric>& nodes, env::FabricRequirement required, const GidPreferences& gids) {
  FabricPlan plan;
  std::vector<Selection> selections;
  bool rdma_expected = false;
  for (const NodeFabric& node : nodes) {
    selections.push_back(SelectPorts(node.inventory, gids));
    plan.nodes.push_back({node.rank, selections.back(), Summary(selections.back())});
    rdma_expected = rdma_expected || selections.back().link_layer == "InfiniBand" || HasBrokenRdmaPort(node.inventory, gids);
  }
  plan.node_count = int(plan.nodes.size());
  plan.nodes_without_rdma = int(plan.RanksWithoutRdma().size());
  plan.policy = required;
  if (required == env::FabricRequirement::kAuto) {
    plan.policy = rdma_expected ? env::FabricRequirement::kIb : env::FabricRequirement::kAny;
  }
  if (!plan.checked() || nodes.empty()) return plan;
  Checker checker(nodes, selections, gids);
  plan.mismatches = checker.Run();
  ApplyPolicy(plan, checker.majority_layer(), required);
  return plan;
}

std::string PolicyName(env::FabricRequirement requirement) {
  switch (requirement) {
    case env::FabricRequirement::kAuto: return "auto";
    case env::FabricRequirement::kIb: return "ib";
    case env::FabricRequirement::kAny: return "any";
    case env::FabricRequirement::kNone: return "none";
  }
  return "auto";
}

std::string FormatMismatches(const std::vector<Mismatch>& mismatches) {
  std::string table;
  char line[512];
  std::snprintf(line, sizeof line, "%-5s %-20s %-14s %-5s %-24s %-26s %s\n", "node", "host", "device", "port", "what",
                "value", "majority");
  table += line;
  for (const Mismatch& row : mismatches) {
    std::snprintf(line, sizeof line, "%-5d %-20s %-14s %-5s %-24s %-26s %s\n", row.rank, row.host.c_str(),
                  row.device.c_str(), row.port.c_str(), row.what.c_str(), row.value.c_str(), row.majority.c_str());
    table += line;
  }
  return table;
}

nlohmann::json FabricPlan::ToJson() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const Mismatch& row : mismatches) {
    rows.push_back({{"rank", row.rank}, {"host", row.host}, {"device", row.device}, {"port", row.port},
                    {"what", row.what}, {"value", row.value}, {"majority", row.majority}});
  }
  nlohmann::json node_list = nlohmann::json::array();
  for (const NodePlan& node : nodes) {
    nlohmann::json ports = nlohmann::json::array();
    for (const SelectedPort& port : node.selection.ports) {
      ports.push_back({{"device", port.device}, {"port", port.port}, {"rate_gbps", port.rate_gbps},
                       {"subnet_prefix", port.subnet_prefix}, {"gid_index", port.gid_index}});
    }
    node_list.push_back({{"rank", node.rank}, {"summary", node.summary}, {"link_layer", node.selection.link_layer},
                         {"ports", ports}, {"excluded", node.selection.excluded}});
  }
  return {{"policy", PolicyName(policy)}, {"ok", ok}, {"failure", failure}, {"use_rdma", use_rdma},
          {"mismatches", rows}, {"warnings", warnings}, {"nodes", node_list}, {"node_count", node_count},
          {"nodes_without_rdma", nodes_without_rdma}};
}

FabricPlan FabricPlan::FromJson(const nlohmann::json& json) {
  try {
    FabricPlan plan;
    const std::string policy = json.at("policy").get<std::string>();
    plan.policy = policy == "ib" ? env::FabricRequirement::kIb
                  : policy == "any" ? env::FabricRequirement::kAny
                  : policy == "none" ? env::FabricRequirement::kNone
                                     : env::FabricRequirement::kAuto;
    plan.ok = json.at("ok").get<bool>();
    plan.failure = json.at("failure").get<std::string>();
    plan.use_rdma = json.at("use_rdma").get<bool>();
    plan.warnings = json.at("warnings").get<std::vector<std::string>>();
    for (const auto& row : json.at("mismatches")) {
      plan.mismatches.push_back({row.at("rank").get<int>(), row.at("host").get<std::string>(),
                                 row.at("device").get<std::string>(), row.at("port").get<std::string>(),
                                 row.at("what").get<std::string>(), row.at("value").get<std::string>(),
                                 row.at("majority").get<std::string>()});
    }
    for (const auto& node : json.at("nodes")) {
      NodePlan entry{node.at("rank").get<int>(), {}, node.at("summary").get<std::string>()};
      entry.selection.link_layer = node.at("link_layer").get<std::string>();
      entry.selection.excluded = node.at("excluded").get<std::vector<std::string>>();
      for (const auto& port : node.at("ports")) {
        entry.selection.ports.push_back({port.at("device").get<std::string>(), port.at("port").get<int>(),
                                         port.at("rate_gbps").get<double>(), port.at("subnet_prefix").get<std::string>(),
                                         port.at("gid_index").get<int>()});
      }
      plan.nodes.push_back(std::move(entry));
    }
    plan.node_count = json.value("node_count", int(plan.nodes.size()));
    plan.nodes_without_rdma = json.value("nodes_without_rdma", int(plan.RanksWithoutRdma().size()));
    return plan;
  } catch (const nlohmann::json::exception& error) {
    throw InventoryError(std::string("fabric plan from the leader: ") + error.what());
  }
}

std::vector<int> FabricPlan::RanksWithoutRdma() const {
  std::vector<int> ranks;
  for (const NodePlan& node : nodes) {
    if (node.selection.link_layer.empty()) ranks.push_back(node.rank);
  }
  return ranks;
}

const NodePlan* FabricPlan::ForRank(int rank) const {
  for (const NodePlan& node : nodes) {
    if (node.rank == rank) return &node;
  }
  return nullptr;
}

}  // namespace bt::rendezvous::fabric
