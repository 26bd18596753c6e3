// Between the rendezvous and the first command every node prepares (weights, loaded
// checkpoints) and then meets the others in a "ready" barrier whose deadline is the
// weights deadline: a node still staging is named with its progress, instead of the
// others timing out on a join.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "env/identity.h"
#include "launcher/exit_codes.h"
#include "launcher/supervision/peers.h"
#include "launcher/supervision/signals.h"
#include "launcher/timeline.h"

namespace bt::launcher {

// This node's phase as the other nodes see it ("staging /models/base: 1.2 of 4.0 GiB"),
// published to the store under bt/phase/<rank>. No-op without a store.
class NodePhase {
 public:
  NodePhase(Peers* peers, int rank);
  void Publish(const std::string& phase);  // at most once a second, unless `phase` is "ready"

 private:
  rendezvous::Store* store_;
  int rank_;
  std::chrono::steady_clock::time_point last_{};
};

// Throws LaunchFailure when the launch must stop: 128+signal for a shutdown signal, 69 when
// a peer failed (the leader's verdict).
void CheckStop(Peers* peers, SignalRouter& signals);

// The peers as every phase before the run sees them (fabric, probe, preflight, weights,
// ready, seed). A blocking get or wait on their store wakes every second to CheckStop: a
// node that failed, a lost leader or a shutdown signal ends it at once instead of at its
// own timeout (120 s for the fabric plan), and a store that breaks is explained by the
// leader's verdict when one came. Not for the run: CheckStop takes the launcher's signals.
class PreRunPeers final : public Peers {
 public:
  PreRunPeers(Peers& peers, SignalRouter& signals);

  int Finish(const JobOutcome& outcome, SignalRouter& signals) override { return peers_.Finish(outcome, signals); }
  void Report(const JobOutcome& outcome) override { peers_.Report(outcome); }
  std::vector<rendezvous::NodeInfo> Roster() override { return peers_.Roster(); }
  std::vector<rendezvous::NodeInfo> BriefRoster() override { return peers_.BriefRoster(); }
  rendezvous::Store* store() override { return store_.get(); }
  std::string LocalAddress() override { return peers_.LocalAddress(); }
  int fd() const override { return peers_.fd(); }
  std::optional<std::string> TakeStop() override { return peers_.TakeStop(); }
  int StopExitCode() override { return peers_.StopExitCode(); }

 private:
  Peers& peers_;
  std::unique_ptr<rendezvous::Store> store_;  // null when `peers` has no store (mpi)
};

// A store call that failed during `phase`, as the launch failure (69) that says so.
LaunchFailure StoreFailure(const std::string& phase, const rendezvous::StoreTimeout& error);
LaunchFailure StoreFailure(const std::string& phase, const rendezvous::StoreError& error);

// A store exception escaping `phases` becomes the launch failure that names the timeline's
// current phase.
template <typename Phases>
void NameStoreFailures(const Timeline& timeline, Phases phases) {
  try {
    phases();
  } catch (const rendezvous::StoreTimeout& error) {
    throw StoreFailure(timeline.Current(), error);
  } catch (const rendezvous::StoreError& error) {
    throw StoreFailure(timeline.Current(), error);
  }
}

// Marks this node ready and waits for every other node until `deadline`. Throws
// LaunchFailure 69 naming each node not ready, its host and its phase.
void WaitUntilAllReady(Peers& peers, const env::NodeIdentity& identity, std::chrono::steady_clock::time_point deadline,
                       SignalRouter& signals);

}  // namespace bt::launcher
