#include "rendezvous/cycles.h"

#include <algorithm>

namespace bt::rendezvous {

Cycles::Cycles(int node_count, RestartPolicy policy)
    : policy_(std::move(policy)), arrived_(size_t(std::max(node_count, 0)), false) {}

std::optional<Message> Cycles::Decide(const CycleFailure& failure, std::string& refusal) {
  if (!policy_) return std::nullopt;
  const auto asked = std::chrono::steady_clock::now();
  RestartAnswer answer = policy_(failure);
  if (!answer.decision) {
    refusal = answer.refusal;
    return std::nullopt;
  }
  // The decision's own time, from the failure reaching the leader: the restart's figures
  // (every job stopped, every node restarted) count from the decision and would hide it.
  (*answer.decision)["decided_in_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  ++current_;
  std::fill(arrived_.begin(), arrived_.end(), false);
  arrived_count_ = 0;
  slowest_stop_s_ = 0;
  decided_ = std::chrono::steady_clock::now();
  return Message{{"op", "restart"},      {"cycle", current_},         {"rank", failure.rank},
                 {"host", failure.host}, {"message", failure.cause}, {"code", failure.exit_code},
                 {"decision", *answer.decision}};
}

std::optional<Message> Cycles::Arrive(int rank, double stopped_s) {
  if (rank < 0 || size_t(rank) >= arrived_.size() || arrived_[size_t(rank)]) return std::nullopt;
  arrived_[size_t(rank)] = true;
  slowest_stop_s_ = std::max(slowest_stop_s_, stopped_s);
  if (++arrived_count_ < int(arrived_.size())) return std::nullopt;
  const double restarted_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - decided_).count();
  return Message{{"op", "cycle_go"}, {"cycle", current_}, {"stopped_s", slowest_stop_s_}, {"restarted_s", restarted_s}};
}

void Cycles::Leave(int rank) {
  if (rank < 0 || size_t(rank) >= arrived_.size() || !arrived_[size_t(rank)]) return;
  arrived_[size_t(rank)] = false;
  --arrived_count_;
}

std::vector<int> Cycles::Awaited() const {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < arrived_.size(); ++rank) {
    if (!arrived_[rank]) ranks.push_back(int(rank));
  }
  return ranks;
}

}  // namespace bt::rendezvous
