#include "rendezvous/cycles.h"

#include <algorithm>

namespace bt::rendezvous {

RankAssignment::RankAssignment(int slots, int ranks) {
  slots = std::max(slots, 0);
  ranks = std::clamp(ranks, 0, slots);
  rank_of_slot_.assign(size_t(slots), -1);
  for (int rank = 0; rank < ranks; ++rank) {
    rank_of_slot_[size_t(rank)] = rank;
    slot_of_rank_.push_back(rank);
  }
}

int RankAssignment::RankOf(int slot) const {
  if (slot < 0 || size_t(slot) >= rank_of_slot_.size()) return -1;
  return rank_of_slot_[size_t(slot)];
}

void RankAssignment::Move(int from, int to) {
  const int rank = RankOf(from);
  if (rank < 0 || !IsSpare(to) || to < 0 || size_t(to) >= rank_of_slot_.size()) return;
  rank_of_slot_[size_t(from)] = -1;
  rank_of_slot_[size_t(to)] = rank;
  slot_of_rank_[size_t(rank)] = to;
}

RankAssignment RankAssignment::FromSlots(int slots, const std::vector<int>& slot_of_rank) {
  RankAssignment assignment(slots, 0);
  assignment.slot_of_rank_ = slot_of_rank;
  for (size_t rank = 0; rank < slot_of_rank.size(); ++rank) assignment.rank_of_slot_[size_t(slot_of_rank[rank])] = int(rank);
  return assignment;
}

std::vector<int> ParseStartRanks(const std::string& text, int slots, int ranks) {
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& error) {
    throw FrameError(std::string(kStartRanksKey) + " is not JSON: " + error.what());
  }
  if (!json.is_array() || int(json.size()) != ranks) {
    throw FrameError(std::string(kStartRanksKey) + " must list the slot of each of the " + std::to_string(ranks) + " ranks");
  }
  std::vector<int> slot_of_rank;
  std::vector<bool> taken(size_t(std::max(slots, 0)), false);
  for (const nlohmann::json& slot : json) {
    if (!slot.is_number_integer() || slot.get<int64_t>() < 0 || slot.get<int64_t>() >= slots || taken[slot.get<size_t>()]) {
      throw FrameError(std::string(kStartRanksKey) + ": " + slot.dump() + " is not a free slot in [0, " +
                       std::to_string(slots) + ")");
    }
    taken[slot.get<size_t>()] = true;
    slot_of_rank.push_back(slot.get<int>());
  }
  return slot_of_rank;
}

void Cycles::StartWith(const std::vector<int>& slots) { assignment_ = RankAssignment::FromSlots(assignment_.slots(), slots); }

Cycles::Cycles(int slots, int ranks, RestartPolicy policy, int max_failures_per_node)
    : policy_(std::move(policy)),
      assignment_(slots, ranks),
      max_failures_per_node_(max_failures_per_node),
      failures_(size_t(std::max(slots, 0)), 0),
      arrived_(size_t(std::max(slots, 0)), false) {}

std::string Cycles::CountFailure(const CycleFailure& failure) {
  if (failure.rank < 0 || size_t(failure.rank) >= failures_.size()) return "";
  const int failures = ++failures_[size_t(failure.rank)];
  if (failure.cannot_train) return "its hardware cannot train";
  if (failure.lost) return "its launcher was lost";
  if (failures >= max_failures_per_node_) {
    return "it failed " + std::to_string(failures) + " cycles (launcher.restart.max_failures_per_node)";
  }
  return "";
}

void Cycles::Promote(int from, int to) {
  assignment_.Move(from, to);
  // What `from`'s launcher failed is not held against the next one in its slot (a replaced
  // pod is new hardware; review D2).
  if (size_t(from) < failures_.size()) failures_[size_t(from)] = 0;
  if (size_t(from) < arrived_.size() && arrived_[size_t(from)]) {
    arrived_[size_t(from)] = false;
    --arrived_count_;
  }
}

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
  if (assignment_.IsSpare(rank)) return std::nullopt;
  arrived_[size_t(rank)] = true;
  slowest_stop_s_ = std::max(slowest_stop_s_, stopped_s);
  if (++arrived_count_ < assignment_.ranks()) return std::nullopt;
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
    if (!arrived_[rank] && !assignment_.IsSpare(int(rank))) ranks.push_back(int(rank));
  }
  return ranks;
}

}  // namespace bt::rendezvous
