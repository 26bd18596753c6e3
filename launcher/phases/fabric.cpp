#include "launcher/phases/fabric.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/phases/rdma_probe.h"
#include "rendezvous/node_info.h"

namespace bt::launcher {
namespace {

namespace fabric = rendezvous::fabric;

constexpr auto kExchangeTimeout = std::chrono::seconds(120);

std::string InventoryKey(int rank) { return "bt/fabric/inventory/" + std::to_string(rank); }
constexpr const char* kPlanKey = "bt/fabric/plan";
constexpr const char* kPlanReadersKey = "bt/fabric/plan/readers";
constexpr const char* kPlanReadByAllKey = "bt/fabric/plan/read-by-all";
// How long node 0 keeps the store up for a failed plan to be read by every node.
constexpr auto kFailedPlanReadTimeout = std::chrono::seconds(10);

// The source address the kernel would route from to reach the leader: a UDP socket's
// connect() picks it without sending anything. Used where no store connection proves it.
std::string RouteSourceAddress(const std::string& host, uint16_t port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  std::string source;
  for (addrinfo* entry = found; entry != nullptr && source.empty(); entry = entry->ai_next) {
    const int fd = socket(entry->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage local{};
    socklen_t length = sizeof local;
    if (connect(fd, entry->ai_addr, entry->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &length) == 0) {
      source = rendezvous::AddressText(reinterpret_cast<sockaddr*>(&local));
    }
    close(fd);
  }
  freeaddrinfo(found);
  return source;
}

// Node 0 reaches itself over loopback when its own name resolves to 127.0.1.1 (Debian's
// /etc/hosts), yet the other nodes must reach it: the interface that routes to a follower's
// address (as node 0 saw it connect) is the one they reach. "" when every node is local.
std::string InterfaceFacingFollowers(const fabric::Inventory& inventory, const env::NodeIdentity& identity,
                                     Peers& peers, uint16_t port) {
  for (const rendezvous::NodeInfo& node : peers.Roster()) {
    if (node.rank == identity.rank || node.seen_from.empty() || IsLoopback(node.seen_from)) continue;
    const std::string name = fabric::InterfaceWithAddress(inventory.interfaces, RouteSourceAddress(node.seen_from, port));
    if (!name.empty() && !fabric::IsLoopbackInterface(inventory.interfaces, name)) return name;
  }
  return "";
}

// The interface holding the address this node reached the leader from.
void FindBootstrapInterface(fabric::Inventory& inventory, const env::NodeIdentity& identity, Peers* peers, uint16_t port) {
  std::string local_address = peers ? peers->LocalAddress() : "";
  if (local_address.empty()) local_address = RouteSourceAddress(identity.leader_addr, port);
  inventory.bootstrap_interface = fabric::InterfaceWithAddress(inventory.interfaces, local_address);
  if (identity.rank != 0 || peers == nullptr || !fabric::IsLoopbackInterface(inventory.interfaces, inventory.bootstrap_interface)) return;
  if (const std::string facing = InterfaceFacingFollowers(inventory, identity, *peers, port); !facing.empty()) {
    spdlog::info("fabric: the leader address {} is loopback here; the other nodes reach this node through {}",
                 identity.leader_addr, facing);
    inventory.bootstrap_interface = facing;
  }
}

// Node 0: every node's inventory, in rank order. A node whose inventory does not parse
// is named, as is one that never published.
// One get per node (it blocks until the key exists), all under one deadline.
std::vector<fabric::NodeFabric> CollectInventories(rendezvous::Store& store, const std::vector<rendezvous::NodeInfo>& roster) {
  const auto deadline = std::chrono::steady_clock::now() + kExchangeTimeout;
  std::vector<fabric::NodeFabric> nodes;
  for (const auto& node : roster) {
    std::string text;
    try {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      text = store.Get(InventoryKey(node.rank), std::max(left, std::chrono::milliseconds(1)));
    } catch (const rendezvous::StoreTimeout&) {
      throw LaunchFailure(kExitUnavailable, "fabric: " + node.Label() + " never published its inventory");
    }
    try {
      nodes.push_back({node.rank, node.host, fabric::Inventory::FromJson(nlohmann::json::parse(text))});
    } catch (const std::exception& error) {
      throw LaunchFailure(kExitUnavailable, "fabric: the inventory of " + node.Label() + " is malformed: " + error.what());
    }
  }
  return nodes;
}

fabric::FabricPlan ExchangeAndPlan(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                                   const fabric::Inventory& inventory, const fabric::GidPreferences& gids) {
  rendezvous::Store* store = peers ? peers->store() : nullptr;
  if (config.launcher.fabric.require == env::FabricRequirement::kNone) store = nullptr;  // nothing to compare
  if (store == nullptr) {
    if (peers && peers->store() == nullptr) spdlog::info("fabric: the mpi backend has no store: this node's fabric is checked on its own");
    return fabric::PlanFabric({{identity.rank, "", inventory}}, config.launcher.fabric.require, gids);
  }
  store->Set(InventoryKey(identity.rank), inventory.ToJson().dump());
  if (identity.rank == 0) {
    const fabric::FabricPlan plan =
        fabric::PlanFabric(CollectInventories(*store, peers->Roster()), config.launcher.fabric.require, gids);
    store->Set(kPlanKey, plan.ToJson().dump());
    // A failed plan makes node 0 exit, which takes the store down: first let every node read
    // it, or a node still reading gets "connection reset" instead of the failure's table.
    if (!plan.ok && peers->Roster().size() > 1) {
      try {
        store->Wait({kPlanReadByAllKey}, kFailedPlanReadTimeout);
      } catch (const rendezvous::StoreTimeout&) {
        spdlog::warn("fabric: not every node read the failed plan within {} s", kFailedPlanReadTimeout.count());
      }
    }
    return plan;
  }
  try {
    auto plan = fabric::FabricPlan::FromJson(nlohmann::json::parse(store->Get(kPlanKey, kExchangeTimeout)));
    if (store->Add(kPlanReadersKey, 1) == int64_t(peers->Roster().size()) - 1) store->Set(kPlanReadByAllKey, "1");
    return plan;
  } catch (const rendezvous::StoreTimeout&) {
    throw LaunchFailure(kExitUnavailable, "fabric: node 0 never published the fabric plan");
  } catch (const nlohmann::json::exception& error) {
    throw LaunchFailure(kExitUnavailable, std::string("fabric: the plan from node 0 is malformed: ") + error.what());
  }
}

void LogPlan(const fabric::FabricPlan& plan, const fabric::NodePlan& node, bool is_leader) {
  if (!plan.checked()) {
    spdlog::info("fabric: launcher.fabric.require is \"none\": not checked; this node: {}", node.summary);
    return;
  }
  spdlog::info("fabric: {} (require = {}, {})", node.summary, fabric::PolicyName(plan.policy),
               plan.use_rdma ? "NCCL uses RDMA" : "NCCL uses sockets");
  for (const std::string& warning : plan.warnings) spdlog::warn("fabric: {}", warning);
  // Sockets with RDMA ports present: every node names them, not only the leader.
  const bool table_everywhere = !plan.use_rdma;
  if ((is_leader || table_everywhere) && plan.ok && !plan.mismatches.empty()) {
    spdlog::warn("fabric differences:\n{}", DescribeMismatches(plan));
  }
}

void ExportNccl(const FabricResult& result, env::JobEnvironment& environment) {
  for (const auto& setting : result.nccl.set) {
    environment.variables[setting.name] = setting.value;
    spdlog::info("fabric: {}={} ({})", setting.name, setting.value, setting.reason);
  }
  for (const auto& setting : result.nccl.kept) {
    const std::string file = environment.variables.contains(setting.name) ? "" : result.nccl_config.SourceOf(setting.name);
    spdlog::info("fabric: {}={} kept{}: {}", setting.name, setting.value, file.empty() ? "" : " (from " + file + ")",
                 setting.reason);
  }
  for (const std::string& warning : result.nccl.warnings) spdlog::warn("fabric: {}", warning);
}

// The user's NCCL settings: the job's environment, else NCCL's config files, which NCCL
// reads under the environment (so an exported variable would silently beat them).
fabric::VariableLookup UserNcclVariables(const FabricResult& result, const env::JobEnvironment& environment) {
  return [&result, &environment](const std::string& name) -> std::optional<std::string> {
    if (auto it = environment.variables.find(name); it != environment.variables.end()) return it->second;
    return result.nccl_config.Find(name);
  };
}

// The config files and the GID preferences, before the plan: node 0 selects RoCE ports by them.
void ReadUserNcclSettings(FabricResult& result, const env::JobEnvironment& environment) {
  auto job_variable = [&environment](const std::string& name) -> std::optional<std::string> {
    auto it = environment.variables.find(name);
    return it == environment.variables.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  result.nccl_config = fabric::NcclConfigFiles::Read(job_variable, fabric::NcclSystemConfigPath(result.inventory.sysfs_root));
  try {
    result.gids = fabric::GidPreferencesFrom(UserNcclVariables(result, environment));
  } catch (const std::invalid_argument& error) {
    throw LaunchFailure(kExitConfig, std::string("fabric: ") + error.what());
  }
}

fabric::NcclEnvironment NcclFor(const FabricResult& result, const fabric::NodePlan& node,
                                const env::JobEnvironment& environment) {
  try {
    return fabric::ComputeNcclEnvironment(result.plan, node, result.inventory, UserNcclVariables(result, environment),
                                          [] { return fabric::FindNcclVersion(); });
  } catch (const std::invalid_argument& error) {
    throw LaunchFailure(kExitConfig, std::string("fabric: ") + error.what());
  }
}

}  // namespace

std::string FormatFabricReport(const FabricResult& fabric, bool json) {
  if (json) {
    nlohmann::json report = fabric.inventory.ToJson();
    report["selection"] = fabric.plan.ToJson()["nodes"][0];
    report["nccl_env"] = fabric::NcclEnvironmentToJson(fabric.nccl);
    return report.dump(2) + "\n";
  }
  const std::string& bootstrap = fabric.inventory.bootstrap_interface;
  std::string text = fabric::FormatInventory(fabric.inventory, fabric.gids) + "\nselected: " + fabric.plan.nodes.front().summary +
                     "\nbootstrap interface: " + (bootstrap.empty() ? "none found" : bootstrap) + "\n\nNCCL environment:\n";
  for (const auto* settings : {&fabric.nccl.set, &fabric.nccl.kept}) {
    for (const auto& setting : *settings) text += "  " + setting.name + "=" + setting.value + "    # " + setting.reason + "\n";
  }
  for (const std::string& warning : fabric.nccl.warnings) text += "warning: " + warning + "\n";
  return text;
}

std::string DescribeMismatches(const fabric::FabricPlan& plan) {
  return plan.mismatches.empty() ? "" : fabric::FormatMismatches(plan.mismatches);
}

fabric::Inventory ReadFabricInventory(const std::string& sysfs_root) {
  fabric::Inventory inventory = fabric::ReadInventory(sysfs_root);
  for (const std::string& warning : inventory.warnings) spdlog::warn("fabric: {}", warning);
  return inventory;
}

FabricResult PlanFabricPhase(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                             fabric::Inventory inventory, env::JobEnvironment& environment) {
  FabricResult result;
  result.inventory = std::move(inventory);
  FindBootstrapInterface(result.inventory, identity, peers, config.launcher.rendezvous.port);
  ReadUserNcclSettings(result, environment);
  result.plan = ExchangeAndPlan(config, identity, peers, result.inventory, result.gids);
  const fabric::NodePlan* node = result.plan.ForRank(identity.rank);
  if (node == nullptr) throw LaunchFailure(kExitUnavailable, "fabric: the plan from node 0 has no entry for this node");
  if (!result.plan.ok) {
    throw LaunchFailure(kExitUnavailable, "fabric: " + result.plan.failure + "\n" + DescribeMismatches(result.plan));
  }
  LogPlan(result.plan, *node, identity.rank == 0);
  result.nccl = NcclFor(result, *node, environment);
  ExportNccl(result, environment);
  RunRdmaProbe(config, identity, peers, result);
  return result;
}

FabricResult InspectFabric(const env::JobConfig& config, const env::NodeIdentity& identity,
                           const std::string& sysfs_root, const env::JobEnvironment& environment) {
  FabricResult result;
  result.inventory = ReadFabricInventory(sysfs_root);
  FindBootstrapInterface(result.inventory, identity, nullptr, config.launcher.rendezvous.port);
  AddActiveMtu(result.inventory);  // libibverbs is loaded here, never on the launch path
  ReadUserNcclSettings(result, environment);
  result.plan = fabric::PlanFabric({{identity.rank, "", result.inventory}}, config.launcher.fabric.require, result.gids);
  result.nccl = NcclFor(result, result.plan.nodes.front(), environment);
  return result;
}

}  // namespace bt::launcher
