#include "launcher/phases/rdma_probe.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstdio>
#include <set>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/plugin.h"
#include "rendezvous/fabric/verbs_plugin.h"

namespace bt::launcher {
namespace {

namespace fabric = rendezvous::fabric;
constexpr int kIterations = 100;

// The plugin's entry points, resolved once.
struct Verbs {
  decltype(&bt_verbs_active_mtu) active_mtu = nullptr;
  decltype(&bt_verbs_open) open = nullptr;
  decltype(&bt_verbs_connect) connect = nullptr;
  decltype(&bt_verbs_pingpong) pingpong = nullptr;
  decltype(&bt_verbs_close) close = nullptr;
  std::string load_error;  // why it is unusable, "" when loaded
};

const Verbs& LoadVerbs() {
  static const Verbs verbs = [] {
    Verbs loaded;
    const std::string path = PluginPath("BT_VERBS_PLUGIN", "libbt_verbs.so");
    void* plugin = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (plugin == nullptr) {
      loaded.load_error = std::string("the verbs plugin cannot be loaded: ") + dlerror();
      return loaded;
    }
    loaded.active_mtu = reinterpret_cast<decltype(loaded.active_mtu)>(dlsym(plugin, "bt_verbs_active_mtu"));
    loaded.open = reinterpret_cast<decltype(loaded.open)>(dlsym(plugin, "bt_verbs_open"));
    loaded.connect = reinterpret_cast<decltype(loaded.connect)>(dlsym(plugin, "bt_verbs_connect"));
    loaded.pingpong = reinterpret_cast<decltype(loaded.pingpong)>(dlsym(plugin, "bt_verbs_pingpong"));
    loaded.close = reinterpret_cast<decltype(loaded.close)>(dlsym(plugin, "bt_verbs_close"));
    if (!loaded.active_mtu || !loaded.open || !loaded.connect || !loaded.pingpong || !loaded.close) {
      loaded.load_error = path + ": missing bt_verbs_* symbols";
    }
    return loaded;
  }();
  return verbs;
}

std::string TakeError(char* error) {
  std::string text = error != nullptr ? error : "unknown error";
  std::free(error);
  return text;
}

// One queue pair of this node toward `peer` on `rail`.
struct Link {
  int low = 0, high = 0, rail = 0, peer = 0;
  fabric::SelectedPort port;
  bt_verbs_endpoint* endpoint = nullptr;
  std::string error;  // the first failed step, "" while fine
  double round_trip_us = 0;

  std::string Key(int rank) const {
    return "bt/fabric/probe/qp/" + std::to_string(low) + "-" + std::to_string(high) + "/" + std::to_string(rail) + "/" +
           std::to_string(rank);
  }
};

std::string ReadyKey(int rank) { return "bt/fabric/probe/ready/" + std::to_string(rank); }
std::string ResultKey(int rank) { return "bt/fabric/probe/result/" + std::to_string(rank); }
constexpr const char* kVerdictKey = "bt/fabric/probe/verdict";

// Every node says whether it can probe; one that cannot makes the probe SKIPPED on all.
std::string AgreeToProbe(rendezvous::Store& store, const env::NodeIdentity& identity, const std::string& my_skip,
                         std::chrono::milliseconds timeout) {
  store.Set(ReadyKey(identity.rank), my_skip.empty() ? "ok" : my_skip);
  for (int rank = 0; rank < identity.count; ++rank) {  // each get waits for its key
    const std::string answer = store.Get(ReadyKey(rank), timeout);
    if (answer != "ok") return "node " + std::to_string(rank) + ": " + answer;
  }
  return "";
}

std::vector<Link> MyLinks(const env::FabricSettings& settings, const env::NodeIdentity& identity, const FabricResult& result) {
  const size_t rails = result.rails_on_every_node;
  const fabric::NodePlan* mine = result.plan.ForRank(identity.rank);
  std::vector<Link> links;
  for (const auto& [low, high] : ProbePairs(settings.probe, identity.count)) {
    if (low != identity.rank && high != identity.rank) continue;
    for (size_t rail = 0; rail < rails; ++rail) {
      Link link;
      link.low = low;
      link.high = high;
      link.rail = int(rail);
      link.peer = low == identity.rank ? high : low;
      link.port = mine->selection.ports[rail];
      links.push_back(link);
    }
  }
  return links;
}

void OpenAndPublish(const Verbs& verbs, rendezvous::Store& store, int rank, Link& link) {
  char* info = nullptr;
  char* error = nullptr;
  if (verbs.open(link.port.device.c_str(), link.port.port, link.port.gid_index, &link.endpoint, &info, &error) != 0) {
    link.error = "bt_verbs_open on " + link.port.device + ":" + std::to_string(link.port.port) + ": " + TakeError(error);
    store.Set(link.Key(rank), "error: " + link.error);
    return;
  }
  store.Set(link.Key(rank), info);
  std::free(info);
}

void Connect(const Verbs& verbs, rendezvous::Store& store, Link& link, std::chrono::milliseconds timeout) {
  const std::string remote = store.Get(link.Key(link.peer), timeout);
  if (!link.error.empty()) return;
  if (remote.rfind("error: ", 0) == 0) {
    link.error = "node " + std::to_string(link.peer) + " could not open its side: " + remote.substr(7);
    return;
  }
  char* error = nullptr;
  if (verbs.connect(link.endpoint, remote.c_str(), &error) != 0) link.error = TakeError(error);
}

nlohmann::json ResultJson(const std::vector<Link>& links, int rank) {
  nlohmann::json results = nlohmann::json::array();
  for (const Link& link : links) {
    results.push_back({{"low", link.low}, {"high", link.high}, {"rail", link.rail}, {"rank", rank},
                       {"device", link.port.device + ":" + std::to_string(link.port.port)},
                       {"round_trip_us", link.round_trip_us}, {"error", link.error}});
  }
  return results;
}

// Node 0: one line per pair and rail, both sides' devices, the round trip or the error.
nlohmann::json Verdict(rendezvous::Store& store, int node_count, std::chrono::milliseconds timeout) {
  std::map<std::tuple<int, int, int>, std::vector<nlohmann::json>> sides;
  for (int rank = 0; rank < node_count; ++rank) {
    for (const auto& side : nlohmann::json::parse(store.Get(ResultKey(rank), timeout))) {
      sides[{side["low"].get<int>(), side["high"].get<int>(), side["rail"].get<int>()}].push_back(side);
    }
  }
  std::string table = "pair      rail  devices                        round trip\n";
  bool ok = true;
  for (const auto& [key, both] : sides) {
    const auto& [low, high, rail] = key;
    std::string devices, outcome;
    double trip = 0;
    for (const auto& side : both) {
      devices += (devices.empty() ? "" : " <-> ") + side["device"].get<std::string>();
      if (!side["error"].get<std::string>().empty()) {
        outcome += (outcome.empty() ? "" : "; ") + ("node " + std::to_string(side["rank"].get<int>()) + ": " +
                                                     side["error"].get<std::string>());
      }
      trip = std::max(trip, side["round_trip_us"].get<double>());
    }
    ok = ok && outcome.empty();
    char line[1024];
    std::snprintf(line, sizeof line, "%-4d<->%-4d%-6d%-31s", low, high, rail, devices.c_str());
    table += line;
    std::snprintf(line, sizeof line, "%.1f us\n", trip);
    table += outcome.empty() ? std::string(line) : "FAILED: " + outcome + "\n";
  }
  return {{"ok", ok}, {"table", table}};
}

}  // namespace

std::vector<std::pair<int, int>> ProbePairs(env::FabricProbe probe, int node_count) {
  std::set<std::pair<int, int>> pairs;
  if (probe == env::FabricProbe::kRing) {
    for (int rank = 0; rank < node_count && node_count > 1; ++rank) {
      const int next = (rank + 1) % node_count;
      pairs.insert({std::min(rank, next), std::max(rank, next)});
    }
  } else if (probe == env::FabricProbe::kAllPairs) {
    for (int low = 0; low < node_count; ++low) {
      for (int high = low + 1; high < node_count; ++high) pairs.insert({low, high});
    }
  }
  return {pairs.begin(), pairs.end()};
}

void AddActiveMtu(fabric::Inventory& inventory) {
  bool accessible = false;
  for (const auto& device : inventory.devices) accessible = accessible || device.uverbs_accessible;
  if (!accessible) return;
  const Verbs& verbs = LoadVerbs();
  if (!verbs.load_error.empty()) {
    spdlog::debug("fabric: active MTU unknown: {}", verbs.load_error);
    return;
  }
  for (auto& device : inventory.devices) {
    for (auto& port : device.ports) {
      int mtu = 0;
      char* error = nullptr;
      if (device.uverbs_accessible && port.Usable() && verbs.active_mtu(device.name.c_str(), port.number, &mtu, &error) == 0) {
        port.active_mtu = mtu;
      } else if (error != nullptr) {
        spdlog::debug("fabric: {}:{} active MTU unknown: {}", device.name, port.number, TakeError(error));
      }
    }
  }
}

// Every node opens all of its queue pairs and publishes them, then connects them, then runs
// the ping-pongs in one global order (pair, rail): the smallest unfinished pair always has
// both sides ready, so nobody waits on a node busy elsewhere for long.
void RunRdmaProbe(const env::JobConfig& config, const env::NodeIdentity& identity, Peers* peers,
                  const FabricResult& fabric) {
  const auto& settings = config.launcher.fabric;
  if (settings.probe == env::FabricProbe::kOff) return;
  rendezvous::Store* store = peers ? peers->store() : nullptr;
  std::string skip;
  if (store == nullptr) skip = "the probe needs two or more nodes and the tcp rendezvous backend";
  else if (!fabric.plan.use_rdma) skip = "the fabric has no RDMA to probe";
  if (!skip.empty()) {
    spdlog::warn("fabric: RDMA probe SKIPPED: {}", skip);
    return;
  }
  const auto timeout = std::chrono::milliseconds(int64_t(settings.probe_timeout_s * 1000)) + std::chrono::seconds(30);
  skip = AgreeToProbe(*store, identity, LoadVerbs().load_error, timeout);
  if (!skip.empty()) {
    spdlog::warn("fabric: RDMA probe SKIPPED: {}", skip);
    return;
  }
  const Verbs& verbs = LoadVerbs();
  std::vector<Link> links = MyLinks(settings, identity, fabric);
  for (Link& link : links) OpenAndPublish(verbs, *store, identity.rank, link);
  for (Link& link : links) Connect(verbs, *store, link, timeout);
  for (Link& link : links) {
    if (!link.error.empty()) continue;
    char* error = nullptr;
    const int timeout_ms = int(settings.probe_timeout_s * 1000);
    if (verbs.pingpong(link.endpoint, link.low == identity.rank, kIterations, timeout_ms, &link.round_trip_us, &error) != 0) {
      link.error = TakeError(error);
    }
  }
  store->Set(ResultKey(identity.rank), ResultJson(links, identity.rank).dump());
  if (identity.rank == 0) store->Set(kVerdictKey, Verdict(*store, identity.count, timeout).dump());
  const auto verdict = nlohmann::json::parse(store->Get(kVerdictKey, timeout));
  for (Link& link : links) verbs.close(link.endpoint);  // after the verdict: the peer may still be writing
  const std::string table = verdict["table"].get<std::string>();
  if (!verdict["ok"].get<bool>()) throw LaunchFailure(kExitUnavailable, "fabric: RDMA probe failed:\n" + table);
  spdlog::info("fabric: RDMA probe passed ({} node pairs):\n{}", ProbePairs(settings.probe, identity.count).size(), table);
}

}  // namespace bt::launcher
