#include "launcher/phases/ready.h"

#include <algorithm>
#include <functional>
#include <thread>

#include <spdlog/spdlog.h>

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kPublishEvery{1};
constexpr std::chrono::seconds kWaitLogEvery{10};
constexpr std::chrono::milliseconds kReadyCheck{500};
constexpr const char* kReadyCount = rendezvous::kReadyCounterKey;
constexpr const char* kAllReady = "bt/ready/all";
// Node 0's summary of the nodes not ready yet, for the others' progress lines.
constexpr const char* kWaitingSummary = "bt/ready/waiting";
constexpr size_t kMaxNodesNamed = 32;
constexpr std::chrono::seconds kStopCheck{1};

std::string PhaseKey(int rank) { return "bt/phase/" + std::to_string(rank); }

// Every node's phase, as node 0 reads it: one request per kMaxPeekKeys nodes, nullopt for a
// node that published none.
std::vector<std::optional<std::string>> ReadPhases(rendezvous::Store& store, int count) {
  std::vector<std::string> keys;
  for (int rank = 0; rank < count; ++rank) keys.push_back(PhaseKey(rank));
  return store.Peek(keys);
}

// "node 3 (host-3) staging /models/base: 12.1 of 40.0 GiB" for the first kMaxNodesNamed nodes
// (not ready yet, without `include_ready`), then how many more.
std::string DescribePhases(const std::vector<std::optional<std::string>>& phases,
                           const std::vector<rendezvous::NodeInfo>& roster, bool include_ready) {
  std::string text;
  size_t named = 0, unnamed = 0;
  for (size_t rank = 0; rank < phases.size(); ++rank) {
    const std::string phase = phases[rank].value_or("(no phase published)");
    if (phase == "ready" && !include_ready) continue;
    if (named == kMaxNodesNamed) {
      ++unnamed;
      continue;
    }
    ++named;
    const std::string host = rank < roster.size() ? roster[rank].host : "?";
    text += (text.empty() ? "" : "; ") + std::string("node ") + std::to_string(rank) + " (" + host + ") " + phase;
  }
  if (unnamed > 0) text += "; and " + std::to_string(unnamed) + " more";
  return text;
}

// What this node says about the nodes it waits for. Node 0 reads their phases (and the hosts
// from its own server) and keeps the summary under kWaitingSummary; the others read that one
// key and the ready count: the leader answers O(nodes) per interval for the whole cluster,
// never O(nodes²), and no read waits for a key that is not there.
std::string DescribeWaiting(Peers& peers, const env::NodeIdentity& identity, bool include_ready) {
  rendezvous::Store& store = *peers.store();
  const std::string ready = std::to_string(store.Add(kReadyCount, 0)) + " of " + std::to_string(identity.count) + " ready";
  if (identity.rank == 0) {
    const auto phases = ReadPhases(store, identity.count);
    const auto roster = peers.Roster();
    store.Set(kWaitingSummary, ready + "; not ready: " + DescribePhases(phases, roster, false));
    return DescribePhases(phases, roster, include_ready);
  }
  const auto summary = store.Peek({kWaitingSummary});
  return summary.front() ? "node 0 says " + *summary.front() : ready + " (node 0's log names the others)";
}

// The progress line's text; a store that fails while it is read makes the line say so,
// never the barrier fail (a stop raised inside a store call goes on).
std::string ProgressText(Peers& peers, const env::NodeIdentity& identity, bool include_ready) {
  try {
    return DescribeWaiting(peers, identity, include_ready);
  } catch (const rendezvous::StoreError& error) {
    return std::string("(cannot read the other nodes' phases: ") + error.what() + ")";
  } catch (const rendezvous::StoreTimeout& error) {
    return std::string("(cannot read the other nodes' phases: ") + error.what() + ")";
  }
}

// Waits up to `slice` for the barrier to open. Node 0 opens it: it waits for the ready count
// to reach every node (on its own server's table, woken by the last node's add), then sets
// kAllReady, which the others wait for on the leader.
bool AllReady(rendezvous::Store& store, const env::NodeIdentity& identity, std::chrono::milliseconds slice) {
  if (identity.rank != 0) {
    try {
      store.Wait({kAllReady}, slice);
      return true;
    } catch (const rendezvous::StoreTimeout&) {
      return false;
    }
  }
  if (!store.WaitCounter(kReadyCount, identity.count, slice)) return false;
  store.Set(kAllReady, "1");
  return true;
}

// Blocking calls in slices of kStopCheck with `check_stop` between them; a broken store
// calls it first too, so that the leader's verdict, when one came, is what the node says.
class StopAwareStore final : public rendezvous::Store {
 public:
  StopAwareStore(rendezvous::Store& store, std::function<void()> check_stop)
      : store_(store), check_stop_(std::move(check_stop)) {}

  void Set(const std::string& key, const std::string& value) override {
    Explained([&] { store_.Set(key, value); });
  }

  int64_t Add(const std::string& key, int64_t delta) override {
    int64_t value = 0;
    Explained([&] { value = store_.Add(key, delta); });
    return value;
  }

  std::vector<std::optional<std::string>> Peek(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> values;
    Explained([&] { values = store_.Peek(keys); });
    return values;
  }

  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string value;
    if (Sliced(Clock::now() + timeout, [&](std::chrono::milliseconds slice) { value = store_.Get(key, slice); })) return value;
    throw rendezvous::StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + key);
  }

  bool WaitCounter(const std::string& key, int64_t at_least, std::chrono::milliseconds timeout) override {
    return Sliced(Clock::now() + timeout, [&](std::chrono::milliseconds slice) {
      if (!store_.WaitCounter(key, at_least, slice)) throw rendezvous::StoreTimeout(key);
    });
  }

  void Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (Sliced(deadline, [&](std::chrono::milliseconds slice) { store_.Wait({keys[i]}, slice); })) continue;
      std::string missing;
      for (size_t j = i; j < keys.size(); ++j) missing += (missing.empty() ? "" : ", ") + keys[j];
      throw rendezvous::StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + missing);
    }
  }

 private:
  template <typename Call>
  void Explained(Call call) {
    try {
      call();
    } catch (const rendezvous::StoreError&) {
      check_stop_();
      throw;
    }
  }

  // True once `call(slice)` returns, false when `deadline` passes first.
  template <typename Call>
  bool Sliced(Clock::time_point deadline, Call call) {
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      try {
        Explained([&] { call(std::clamp<std::chrono::milliseconds>(left, std::chrono::milliseconds(1), kStopCheck)); });
        return true;
      } catch (const rendezvous::StoreTimeout&) {
      }
      check_stop_();
      if (Clock::now() >= deadline) return false;
    }
  }

  rendezvous::Store& store_;
  std::function<void()> check_stop_;
};

}  // namespace

PreRunPeers::PreRunPeers(Peers& peers, SignalRouter& signals) : peers_(peers) {
  if (peers.store() == nullptr) return;
  store_ = std::make_unique<StopAwareStore>(*peers.store(), [this, &signals] { CheckStop(this, signals); });
}

LaunchFailure StoreFailure(const std::string& phase, const rendezvous::StoreTimeout& error) {
  return LaunchFailure(kExitUnavailable, phase + ": the other nodes did not answer in time (" + error.what() + ")");
}

LaunchFailure StoreFailure(const std::string& phase, const rendezvous::StoreError& error) {
  return LaunchFailure(kExitUnavailable, phase + ": leader (node 0) lost: " + error.what());
}

NodePhase::NodePhase(Peers* peers, int rank) : store_(peers ? peers->store() : nullptr), rank_(rank) {}

void NodePhase::Publish(const std::string& phase) {
  if (store_ == nullptr) return;
  if (phase != "ready" && Clock::now() - last_ < kPublishEvery) return;
  last_ = Clock::now();
  try {
    store_->Set(PhaseKey(rank_), phase);
  } catch (const rendezvous::StoreError& error) {  // a stop (LaunchFailure) goes on
    spdlog::debug("cannot publish this node's phase: {}", error.what());
  }
}

void CheckStop(Peers* peers, SignalRouter& signals) {
  while (auto signal_number = signals.Take()) {
    if (StartsShutdown(*signal_number)) {
      throw LaunchFailure(128 + *signal_number, std::string("stopped by ") + strsignal(*signal_number) + " before the start commands");
    }
  }
  if (peers == nullptr) return;
  if (auto reason = peers->TakeStop()) throw LaunchFailure(peers->StopExitCode(), "stopping: " + *reason);
}

void WaitUntilAllReady(Peers& peers, const env::NodeIdentity& identity, Clock::time_point deadline, SignalRouter& signals) {
  rendezvous::Store* store = peers.store();
  if (store == nullptr) return;  // the mpi backend: ranks start together under mpirun
  NodePhase(&peers, identity.rank).Publish("ready");
  store->Add(kReadyCount, 1);
  // Each slice looks for a stop, the deadline and the next progress line in between; the
  // progress costs the leader a few requests, never a wait. A lost leader is PreRunPeers'
  // to name.
  auto last_log = Clock::now();
  while (!AllReady(*store, identity, kReadyCheck)) {
    CheckStop(&peers, signals);
    if (Clock::now() >= deadline) {
      throw LaunchFailure(kExitUnavailable, "nodes not ready by the weights deadline (launcher.weights.timeout_s): " +
                                                ProgressText(peers, identity, false));
    }
    if (Clock::now() - last_log >= kWaitLogEvery) {
      spdlog::info("waiting for every node to be ready: {}", ProgressText(peers, identity, true));
      last_log = Clock::now();
    }
  }
  spdlog::info("all {} nodes are ready", identity.count);
}

}  // namespace bt::launcher
