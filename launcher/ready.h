// Between the rendezvous and the first command every node prepares (weights, loaded
// checkpoints) and then meets the others in a "ready" barrier whose deadline is the
// weights deadline: a node still staging is named with its progress, instead of the
// others timing out on a join.
#pragma once

#include <chrono>
#include <string>

#include "env/identity.h"
#include "launcher/peers.h"
#include "launcher/signals.h"

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

// Marks this node ready and waits for every other node until `deadline`. Throws
// LaunchFailure 69 naming each node not ready, its host and its phase.
void WaitUntilAllReady(Peers& peers, const env::NodeIdentity& identity, std::chrono::steady_clock::time_point deadline,
                       SignalRouter& signals);

}  // namespace bt::launcher
