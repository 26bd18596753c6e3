// Restart in place as the leader sees it (docs/PROTOCOL.md, "Cycles"): the job's cycle
// number, the decision to run the next cycle instead of aborting, and the barrier every
// node passes before the next cycle's commands. The leader's server owns one; the policy
// (the budget, the checkpoint to resume from) is the launcher's.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/wire.h"

namespace bt::rendezvous {

// A node's failure in a cycle, as the policy is asked about it.
struct CycleFailure {
  int64_t cycle = 0;
  int rank = -1;
  std::string host;
  std::string cause;  // one line naming the node and how it failed
  int exit_code = 0;
};

// The policy's answer: the fields pushed with the restart (the checkpoint to resume from,
// the budget used; Cycles adds "decided_in_s", how long the policy took), or why the job
// ends instead.
struct RestartAnswer {
  std::optional<Message> decision;
  std::string refusal;
};

// Runs on the leader's server thread, once per failure of the current cycle: it must not
// block (no storage I/O), or every heartbeat waits for it and the nodes declare the leader lost.
using RestartPolicy = std::function<RestartAnswer(const CycleFailure&)>;

class Cycles {
 public:
  Cycles(int node_count, RestartPolicy policy);

  int64_t current() const { return current_; }
  // A message of an earlier cycle: it must never change the job's state.
  bool IsStale(int64_t cycle) const { return cycle < current_; }

  // The "restart" frame to push to every node, the cycle advanced; nullopt (with `refusal`
  // set when the policy gave a reason) when the job must end instead.
  std::optional<Message> Decide(const CycleFailure& failure, std::string& refusal);

  // Records `rank` at the barrier of the current cycle (`stopped_s`: how long its job took to
  // stop after the push); the "cycle_go" frame once every node has arrived, exactly once per
  // cycle, with the restart's figures: the decision to every job stopped (`stopped_s`) and
  // to every node ready (`restarted_s`).
  std::optional<Message> Arrive(int rank, double stopped_s = 0);
  // `rank` is no longer at the current cycle's barrier (its launcher was lost while the
  // barrier waited): it is awaited again, and the cycle stays the same.
  void Leave(int rank);
  // The ranks not yet at the current cycle's barrier.
  std::vector<int> Awaited() const;

 private:
  RestartPolicy policy_;
  int64_t current_ = 0;
  std::vector<bool> arrived_;
  int arrived_count_ = 0;
  double slowest_stop_s_ = 0;
  std::chrono::steady_clock::time_point decided_;
};

}  // namespace bt::rendezvous
