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

#include "rendezvous/commit_keys.h"
#include "rendezvous/wire.h"

namespace bt::rendezvous {

// A node's failure in a cycle, as the policy is asked about it.
struct CycleFailure {
  int64_t cycle = 0;
  int rank = -1;  // the failed launcher's slot
  std::string host;
  std::string cause;  // one line naming the node and how it failed
  int exit_code = 0;
  bool lost = false;          // its launcher is gone (no report)
  bool cannot_train = false;  // its hardware cannot train (launcher.health), as its launcher said
  // A checkpoint leader on another launcher than node 0's (rank 0 on a spare): its commits, as
  // the server read them once it sealed the failed cycle (rendezvous/commit_keys.h).
  RemoteCommits remote_commits;
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

// Which launcher slot runs which training rank (launcher.spares, docs/SPARES.md): slots
// 0..ranks-1 start with their own rank, the others are hot spares. A slot's rank moves to a
// spare when its node leaves, slot 0's too (its launcher keeps serving the store).
class RankAssignment {
 public:
  RankAssignment(int slots, int ranks);

  int slots() const { return int(rank_of_slot_.size()); }
  int ranks() const { return int(slot_of_rank_.size()); }
  int RankOf(int slot) const;  // -1: a spare (or out of range)
  int SlotOf(int rank) const { return slot_of_rank_.at(size_t(rank)); }
  bool IsSpare(int slot) const { return RankOf(slot) < 0; }
  // Moves `from`'s rank to `to` (a spare); `from` becomes a spare slot.
  void Move(int from, int to);
  // [slot of rank 0, slot of rank 1, ...]: what a restart tells every node.
  std::vector<int> Slots() const { return slot_of_rank_; }
  // The assignment `slots` ([slot of rank 0, ...], ParseStartRanks' checks passed) names.
  static RankAssignment FromSlots(int slots, const std::vector<int>& slot_of_rank);

 private:
  std::vector<int> rank_of_slot_;
  std::vector<int> slot_of_rank_;
};

// With hot spares, the slot of each rank from the first cycle, set by node 0 once it has
// read every node's health (a node that cannot train starts as a spare; launcher/phases/health.cpp).
inline constexpr const char* kStartRanksKey = "bt/ranks";

// kStartRanksKey's value: a JSON array, one distinct slot in [0, slots) per rank. Throws
// FrameError naming what is wrong.
std::vector<int> ParseStartRanks(const std::string& text, int slots, int ranks);

class Cycles {
 public:
  // `ranks`: the training ranks (compute.node_count), `slots` every launcher's, spares
  // included; `max_failures_per_node`: failures blamed on one slot after which its rank
  // moves to a ready spare.
  Cycles(int slots, int ranks, RestartPolicy policy, int max_failures_per_node = 2);
  explicit Cycles(int node_count, RestartPolicy policy = {}) : Cycles(node_count, node_count, std::move(policy)) {}

  int64_t current() const { return current_; }
  const RankAssignment& assignment() const { return assignment_; }
  bool HasSpares() const { return assignment_.slots() > assignment_.ranks(); }
  // Why `failure`'s slot must leave its rank when a spare is ready ("": it restarts in place):
  // its hardware cannot train, its launcher is gone, or it failed max_failures_per_node
  // cycles. Counts the failure against the slot.
  std::string CountFailure(const CycleFailure& failure);
  // Gives `from`'s rank to the spare `to` in the current cycle; the barrier awaits `to`.
  void Promote(int from, int to);
  // A new launcher joined in `slot`: its predecessor's failures are not held against it.
  void ForgetFailures(int slot) {
    if (slot >= 0 && size_t(slot) < failures_.size()) failures_[size_t(slot)] = 0;
  }
  // Before the first cycle: the slot of each rank (ParseStartRanks' checks passed).
  void StartWith(const std::vector<int>& slots);
  // A message of an earlier cycle: it must never change the job's state.
  bool IsStale(int64_t cycle) const { return cycle < current_; }

  // The "restart" frame to push to every node, the cycle advanced; nullopt (with `refusal`
  // set when the policy gave a reason) when the job must end instead.
  std::optional<Message> Decide(const CycleFailure& failure, std::string& refusal);

  // Records slot `rank` at the barrier of the current cycle (a spare's arrival counts for
  // nothing) (`stopped_s`: how long its job took to
  // stop after the push); the "cycle_go" frame once every node has arrived, exactly once per
  // cycle, with the restart's figures: the decision to every job stopped (`stopped_s`) and
  // to every node ready (`restarted_s`).
  std::optional<Message> Arrive(int rank, double stopped_s = 0);
  // `rank` is no longer at the current cycle's barrier (its launcher was lost while the
  // barrier waited): it is awaited again, and the cycle stays the same.
  void Leave(int rank);
  // The slots running a rank that are not yet at the current cycle's barrier.
  std::vector<int> Awaited() const;

 private:
  RestartPolicy policy_;
  RankAssignment assignment_;
  int max_failures_per_node_;
  std::vector<int> failures_;  // by slot: cycle failures blamed on it
  int64_t current_ = 0;
  std::vector<bool> arrived_;
  int arrived_count_ = 0;
  double slowest_stop_s_ = 0;
  std::chrono::steady_clock::time_point decided_;
};

}  // namespace bt::rendezvous
