#include "launcher/phases/ready.h"

#include <algorithm>
#include <functional>

#include <spdlog/spdlog.h>

namespace bt::launcher {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kPublishEvery{1};
constexpr std::chrono::seconds kWaitLogEvery{10};
constexpr std::chrono::milliseconds kReadyCheck{500};
constexpr const char* kAllReady = "bt/ready/all";
constexpr std::chrono::seconds kPhaseReadTimeout{2};
constexpr std::chrono::seconds kStopCheck{1};

std::string PhaseKey(int rank) { return "bt/phase/" + std::to_string(rank); }

// "node 3 (host-3) staging /models/base: 12.1 of 40.0 GiB" for every node (every node not
// ready yet, without `include_ready`): the roster with each node's phase.
std::string DescribePhases(Peers& peers, const env::NodeIdentity& identity, bool include_ready) {
  rendezvous::Store* store = peers.store();
  std::vector<rendezvous::NodeInfo> roster = peers.Roster();
  std::string text;
  for (int rank = 0; rank < identity.count; ++rank) {
    std::string phase = "(no phase published)";
    try {
      phase = store->Get(PhaseKey(rank), kPhaseReadTimeout);
    } catch (const rendezvous::StoreTimeout&) {
    } catch (const rendezvous::StoreError&) {  // a stop (LaunchFailure) goes on
    }
    if (phase == "ready" && !include_ready) continue;
    std::string host = rank < int(roster.size()) ? roster[size_t(rank)].host : "?";
    text += (text.empty() ? "" : "; ") + std::string("node ") + std::to_string(rank) + " (" + host + ") " + phase;
  }
  return text;
}

// Waits up to kReadyCheck for the barrier to open.
bool AllReady(rendezvous::Store& store) {
  try {
    store.Wait({kAllReady}, kReadyCheck);
    return true;
  } catch (const rendezvous::StoreTimeout&) {
    return false;
  }
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

  std::string Get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string value;
    if (Sliced(Clock::now() + timeout, [&](std::chrono::milliseconds slice) { value = store_.Get(key, slice); })) return value;
    throw rendezvous::StoreTimeout("timed out after " + std::to_string(timeout.count()) + " ms waiting for " + key);
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
  if (auto reason = peers->TakeStop()) throw LaunchFailure(kExitUnavailable, "stopping: " + *reason);
}

void WaitUntilAllReady(Peers& peers, const env::NodeIdentity& identity, Clock::time_point deadline, SignalRouter& signals) {
  rendezvous::Store* store = peers.store();
  if (store == nullptr) return;  // the mpi backend: ranks start together under mpirun
  NodePhase(&peers, identity.rank).Publish("ready");
  // The last node to get ready opens the barrier; the others wait for that key on the
  // leader, which answers the moment it is set, waking every kReadyCheck to look for a
  // stop, the deadline and the next progress line. A lost leader is PreRunPeers' to name.
  if (store->Add("bt/ready", 1) == identity.count) store->Set(kAllReady, "1");
  auto last_log = Clock::now();
  while (!AllReady(*store)) {
    CheckStop(&peers, signals);
    if (Clock::now() >= deadline) {
      throw LaunchFailure(kExitUnavailable, "nodes not ready by the weights deadline (launcher.weights.timeout_s): " +
                                                DescribePhases(peers, identity, false));
    }
    if (Clock::now() - last_log >= kWaitLogEvery) {
      spdlog::info("waiting for every node to be ready: {}", DescribePhases(peers, identity, true));
      last_log = Clock::now();
    }
  }
  spdlog::info("all {} nodes are ready", identity.count);
}

}  // namespace bt::launcher
