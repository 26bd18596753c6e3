#include "launcher/phases/fabric.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <thread>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/phases/rdma_probe.h"
#include "rendezvous/node_info.h"
#include "rendezvous/wire.h"

namespace bt::launcher {
namespace {

namespace fabric = rendezvous::fabric;

constexpr auto kExchangeTimeout = std::chrono::seconds(120);

std::string InventoryKey(int rank) { return "bt/fabric/inventory/" + std::to_string(rank); }
constexpr const char* kPlanKey = "bt/fabric/plan";
constexpr const char* kPlanReadersKey = "bt/fabric/plan/readers";
// A counter: the nodes whose inventory is published. Node 0 waits for it to reach every node.
constexpr const char* kPublishedKey = "bt/fabric/published";
// How long node 0 keeps the store up for a failed plan to be read by every node, and how
// often it counts the readers meanwhile.
constexpr auto kFailedPlanReadTimeout = std::chrono::seconds(10);
constexpr auto kPlanReadersPoll = std::chrono::milliseconds(50);
// The rows of the mismatch table node 0 sends every node; its own log has them all.
constexpr size_t kMaxSharedMismatches = 64;

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
  for (const rendezvous::NodeInfo& node : peers.BriefRoster()) {
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

// A node's published inventory: the MessagePack of its JSON document (what nodes publish:
// 20% smaller, and read without a text parse, about twice as fast at node 0 for 1,024
// nodes), or the JSON text itself (a node of an earlier build, tests).
std::string EncodeInventory(const fabric::Inventory& inventory) {
  std::string packed;
  nlohmann::json::to_msgpack(inventory.ToJson(), nlohmann::detail::output_adapter<char>(packed));
  return packed;
}

fabric::Inventory DecodeInventory(const std::string& value) {
  const size_t first = value.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && value[first] == '{') return fabric::Inventory::FromJson(nlohmann::json::parse(value));
  return fabric::Inventory::FromJson(rendezvous::DecodeMsgpack(value));  // FrameError when it is neither
}

// Node 0 parses the inventories on up to this many threads, each taking at least
// kInventoriesPerThread: one inventory is a JSON document of ~6 KiB whose parse (~0.2-0.3 ms)
// is most of what the fabric phase costs node 0 at 1,024 nodes and more.
constexpr size_t kMaxParseThreads = 32;
constexpr size_t kInventoriesPerThread = 64;

// Parses the inventories of nodes `indices[first, end)` into `parsed`, or says in `errors` why
// one cannot be. Runs on helper threads, where an exception would call std::terminate:
// nothing leaves it.
void ParseInventoryRange(const std::vector<rendezvous::NodeInfo>& roster, const std::vector<std::optional<std::string>>& texts,
                         const std::vector<size_t>& indices, size_t first, size_t end, std::vector<fabric::NodeFabric>& parsed,
                         std::vector<std::string>& errors) noexcept {
  for (size_t at = first; at < end; ++at) {
    const size_t i = indices[at];
    const rendezvous::NodeInfo& node = roster[i];
    try {
      parsed[i] = {node.rank, node.host, DecodeInventory(*texts[i])};
    } catch (const std::exception& error) {
      errors[i] = "the inventory of " + node.Label() + " is malformed: " + error.what();
    } catch (...) {
      errors[i] = "the inventory of " + node.Label() + " could not be parsed";
    }
  }
}

// The inventories of nodes `indices`, parsed on as many cores as node 0 has (a leader has
// many: the parse then costs N / cores).
void ParseInventories(const std::vector<rendezvous::NodeInfo>& roster, const std::vector<std::optional<std::string>>& texts,
                      const std::vector<size_t>& indices, std::vector<fabric::NodeFabric>& parsed, std::vector<std::string>& errors) {
  const size_t count = indices.size();
  const size_t wanted = (count + kInventoriesPerThread - 1) / kInventoriesPerThread;
  const size_t threads = std::clamp<size_t>(std::min<size_t>(wanted, std::thread::hardware_concurrency()), 1, kMaxParseThreads);
  const size_t share = std::max<size_t>(1, (count + threads - 1) / threads);
  std::vector<std::jthread> helpers;
  for (size_t first = share; first < count; first += share) {
    helpers.emplace_back(ParseInventoryRange, std::cref(roster), std::cref(texts), std::cref(indices), first,
                         std::min(count, first + share), std::ref(parsed), std::ref(errors));
  }
  ParseInventoryRange(roster, texts, indices, 0, std::min(count, share), parsed, errors);
}

// How often node 0 takes the inventories that arrived since it last looked, while it waits
// for the rest: the parse overlaps the arrivals instead of starting after the last one.
constexpr auto kArrivalSlice = std::chrono::milliseconds(50);

// Node 0: every node's inventory, in rank order. Until every other node has counted itself
// published, it reads (in-process, on its own server's table: no request) the inventories
// that arrived and parses them, then the rest. Its own is the one in hand: it publishes it
// after the plan, so that its request does not queue behind every other node's (720 ms at
// 16,384 nodes). The first node by rank that never published, or whose inventory does not
// parse, is named.
std::vector<fabric::NodeFabric> CollectInventories(rendezvous::Store& store, const std::vector<rendezvous::NodeInfo>& roster,
                                                   int own_rank, const fabric::Inventory& own) {
  const auto started = std::chrono::steady_clock::now();
  const auto deadline = started + kExchangeTimeout;
  std::vector<std::optional<std::string>> texts(roster.size());
  std::vector<fabric::NodeFabric> parsed(roster.size());
  std::vector<std::string> errors(roster.size());
  std::vector<size_t> waiting;
  for (size_t i = 0; i < roster.size(); ++i) {
    if (roster[i].rank == own_rank) {
      // As the others read it from the store: exactly what it publishes, nothing it does not.
      parsed[i] = {own_rank, roster[i].host, DecodeInventory(EncodeInventory(own))};
    } else {
      waiting.push_back(i);
    }
  }
  size_t rounds = 0;
  while (!waiting.empty()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    const bool all_in = store.WaitCounter(kPublishedKey, int64_t(roster.size()) - 1,
                                          std::clamp(left, std::chrono::milliseconds(0), kArrivalSlice));
    std::vector<std::string> keys;
    keys.reserve(waiting.size());
    for (size_t i : waiting) keys.push_back(InventoryKey(roster[i].rank));
    auto values = store.Peek(keys);
    std::vector<size_t> arrived, still_waiting;
    for (size_t at = 0; at < waiting.size(); ++at) {
      if (values[at]) {
        texts[waiting[at]] = std::move(values[at]);
        arrived.push_back(waiting[at]);
      } else {
        still_waiting.push_back(waiting[at]);
      }
    }
    ++rounds;
    ParseInventories(roster, texts, arrived, parsed, errors);
    for (size_t i : arrived) texts[i].reset();  // parsed: the bytes are not needed any more
    waiting.swap(still_waiting);
    if (all_in || std::chrono::steady_clock::now() >= deadline) break;
  }
  for (size_t i : waiting) errors[i] = roster[i].Label() + " never published its inventory";
  spdlog::debug("fabric: every inventory read and parsed {:.1f} ms after node 0 began waiting, in {} rounds",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count(), rounds);
  for (const std::string& error : errors) {
    if (!error.empty()) throw LaunchFailure(kExitUnavailable, "fabric: " + error);
  }
  return parsed;
}

size_t RailsOnEveryNode(const fabric::FabricPlan& plan) {
  size_t rails = SIZE_MAX;
  for (const auto& node : plan.nodes) rails = std::min(rails, node.selection.ports.size());
  return plan.nodes.empty() ? 0 : rails;
}

// What node 0 sends every other node: the verdict, the first rows of the mismatch table and
// the rails every node has, the same few KiB at any node count (no node's selection: each
// node makes its own from its own inventory, as node 0 did).
std::string SharedPlanJson(const fabric::FabricPlan& plan) {
  fabric::FabricPlan shared = plan;
  shared.nodes.clear();
  if (shared.mismatches.size() > kMaxSharedMismatches) {
    if (!shared.ok) {
      shared.failure += " (the first " + std::to_string(kMaxSharedMismatches) + " of " +
                        std::to_string(shared.mismatches.size()) + " differences below; node 0's log has them all)";
    }
    shared.mismatches.resize(kMaxSharedMismatches);
  }
  nlohmann::json json = shared.ToJson();
  json["rails_on_every_node"] = RailsOnEveryNode(plan);
  return json.dump();
}

// A failed plan makes node 0 exit, which takes the store down: first let every node read
// it, or a node still reading gets "connection reset" instead of the failure's table.
void AwaitPlanReaders(rendezvous::Store& store, int node_count) {
  const auto deadline = std::chrono::steady_clock::now() + kFailedPlanReadTimeout;
  while (store.Add(kPlanReadersKey, 0) < node_count - 1) {
    if (std::chrono::steady_clock::now() >= deadline) {
      spdlog::warn("fabric: not every node read the failed plan within {} s", kFailedPlanReadTimeout.count());
      return;
    }
    std::this_thread::sleep_for(kPlanReadersPoll);
  }
}

// Node 0 plans for every node; the others take its verdict and add their own selection.
void ExchangeAndPlan(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers, FabricResult& result) {
  rendezvous::Store* store = peers ? peers->store() : nullptr;
  const auto required = config.launcher.fabric.require;
  if (required == env::FabricRequirement::kNone) store = nullptr;  // nothing to compare
  if (store == nullptr) {
    if (peers && peers->store() == nullptr) spdlog::info("fabric: the mpi backend has no store: this node's fabric is checked on its own");
    result.plan = fabric::PlanFabric({{identity.rank, "", result.inventory}}, required, result.gids);
    result.rails_on_every_node = RailsOnEveryNode(result.plan);
    return;
  }
  if (identity.rank == 0) {
    // Node 0's roster is its own server's: no request.
    auto inventories = CollectInventories(*store, peers->BriefRoster(), identity.rank, result.inventory);
    const auto planning = std::chrono::steady_clock::now();
    result.plan = fabric::PlanFabric(inventories, required, result.gids);
    spdlog::debug("fabric: planned {} nodes in {:.1f} ms", inventories.size(),
                  std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - planning).count());
    result.rails_on_every_node = RailsOnEveryNode(result.plan);
    // Published for what reads every inventory (`bt-launch rendezvous` on a follower), before the plan.
    store->Set(InventoryKey(identity.rank), EncodeInventory(result.inventory));
    store->Add(kPublishedKey, 1);
    store->Set(kPlanKey, SharedPlanJson(result.plan));
    if (!result.plan.ok && identity.count > 1) AwaitPlanReaders(*store, identity.count);
    return;
  }
  store->Set(InventoryKey(identity.rank), EncodeInventory(result.inventory));
  store->Add(kPublishedKey, 1);
  try {
    const auto shared = nlohmann::json::parse(store->Get(kPlanKey, kExchangeTimeout));
    store->Add(kPlanReadersKey, 1);
    result.plan = fabric::FabricPlan::FromJson(shared);
    result.plan.nodes = fabric::PlanFabric({{identity.rank, "", result.inventory}}, result.plan.policy, result.gids).nodes;
    result.rails_on_every_node = shared.value("rails_on_every_node", RailsOnEveryNode(result.plan));
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
  result.nccl_config = fabric::NcclConfigFiles::Read(job_variable, fabric::NcclUserHome(),
                                                     fabric::NcclSystemConfigPath(result.inventory.sysfs_root));
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
  const auto started = std::chrono::steady_clock::now();
  FindBootstrapInterface(result.inventory, identity, peers, config.launcher.rendezvous.port);
  ReadUserNcclSettings(result, environment);
  spdlog::debug("fabric: bootstrap interface and NCCL settings in {:.1f} ms",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count());
  ExchangeAndPlan(config, identity, peers, result);
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

fabric::FabricPlan ReadWholePlan(const env::JobConfig& config, Peers& peers, int node_count,
                                 const fabric::GidPreferences& gids) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < node_count; ++rank) keys.push_back(InventoryKey(rank));
  const auto inventories = peers.store()->Peek(keys);
  const auto roster = peers.Roster();
  std::vector<fabric::NodeFabric> nodes;
  for (int rank = 0; rank < node_count; ++rank) {
    if (!inventories[size_t(rank)]) continue;
    const std::string host = size_t(rank) < roster.size() ? roster[size_t(rank)].host : "?";
    nodes.push_back({rank, host, DecodeInventory(*inventories[size_t(rank)])});
  }
  return fabric::PlanFabric(nodes, config.launcher.fabric.require, gids);
}

FabricResult InspectFabric(const env::JobConfig& config, const env::NodeIdentity& identity,
                           const std::string& sysfs_root, const env::JobEnvironment& environment) {
  FabricResult result;
  result.inventory = ReadFabricInventory(sysfs_root);
  FindBootstrapInterface(result.inventory, identity, nullptr, config.launcher.rendezvous.port);
  AddActiveMtu(result.inventory);  // libibverbs is loaded here, never on the launch path
  ReadUserNcclSettings(result, environment);
  result.plan = fabric::PlanFabric({{identity.rank, "", result.inventory}}, config.launcher.fabric.require, result.gids);
  result.rails_on_every_node = RailsOnEveryNode(result.plan);
  result.nccl = NcclFor(result, result.plan.nodes.front(), environment);
  return result;
}

}  // namespace bt::launcher
