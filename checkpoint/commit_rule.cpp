#include "checkpoint/commit_rule.h"

#include <algorithm>

namespace bt::checkpoint {

const char* PartKindName(PartKind kind) {
  switch (kind) {
    case PartKind::kVersion: return "version";
    case PartKind::kNoPart: return "no part";
    case PartKind::kLost: return "lost";
  }
  return "?";
}

const char* DecisionName(Decision decision) {
  switch (decision) {
    case Decision::kPending: return "pending";
    case Decision::kCommit: return "commit";
    case Decision::kAbandon: return "abandon";
  }
  return "?";
}

CommitRule::CommitRule(int rank_count) : rank_count_(rank_count) {
  for (int rank = 0; rank < rank_count_; ++rank) incarnations_[rank] = {0};
}

void CommitRule::Declare(const SaveDeclaration& declaration) {
  // Numbers only grow: a declaration read twice (or out of order) is never a second save.
  if (declaration.number < next_number_ && !saves_.empty()) return;
  next_number_ = declaration.number + 1;
  cycle_ = std::max(cycle_, declaration.cycle);
  SaveState& save = saves_[declaration.number];
  save.declaration = declaration;
  if (declaration.cycle < cycle_) return EndedByRestart(save);
  // A rank replaced since the save's cycle (a replacement joined before node 0 declared a
  // save its predecessor wrote) cannot answer it any more.
  Settle(save);
}

int64_t CommitRule::Incarnation(int rank) const {
  auto found = incarnations_.find(rank);
  return found == incarnations_.end() ? -1 : found->second.back();
}

int64_t CommitRule::IncarnationAt(int rank, int64_t cycle) const {
  int64_t at = -1;
  for (int64_t incarnation : incarnations_.at(rank)) {
    if (incarnation <= cycle) at = incarnation;
  }
  return at;
}

bool CommitRule::Answer(const PartAnswer& answer) {
  if (answer.rank < 0 || answer.rank >= rank_count_) return false;
  auto found = saves_.find(answer.declaration);
  if (found == saves_.end()) return false;
  SaveState& save = found->second;
  if (save.decision != Decision::kPending || save.answers.contains(answer.rank)) return false;
  // Only the launcher running the rank now: an earlier one was replaced, its word is stale.
  if (answer.incarnation != Incarnation(answer.rank)) return false;
  const bool ran_it = answer.incarnation == IncarnationAt(answer.rank, save.declaration.cycle);
  RankPart part{answer.kind, answer.kind == PartKind::kVersion ? answer.version : "", answer.cycle};
  if (answer.kind != PartKind::kLost) {
    // A part (or its absence) is that save's only if the launcher that ran the rank then saw
    // it in that save's cycle: a part of a later cycle never completes an earlier save.
    if (!ran_it) return false;
    if (answer.cycle != save.declaration.cycle || (answer.kind == PartKind::kVersion && answer.version.empty())) {
      part = RankPart{PartKind::kLost, "", answer.cycle};
    }
  }
  save.answers[answer.rank] = part;
  Settle(save);
  return true;
}

void CommitRule::Replace(int rank, int64_t incarnation) {
  if (rank < 0 || rank >= rank_count_ || incarnation <= Incarnation(rank)) return;
  incarnations_[rank].push_back(incarnation);
  for (auto& [number, save] : saves_) {
    if (save.decision != Decision::kPending || save.answers.contains(rank)) continue;
    if (save.declaration.cycle >= incarnation) continue;  // declared in the replacement's time
    Settle(save);
  }
}

void CommitRule::Restart(int64_t cycle) {
  if (cycle <= cycle_) return;
  cycle_ = cycle;
  for (auto& [number, save] : saves_) {
    if (save.decision == Decision::kPending && save.declaration.cycle < cycle_) EndedByRestart(save);
  }
}

// The restart's decision named the newest commit before it; nothing of its cycle commits after.
void CommitRule::EndedByRestart(SaveState& save) {
  Decide(save, Decision::kAbandon,
         "cycle " + std::to_string(save.declaration.cycle) + " ended (the job restarted in cycle " +
             std::to_string(cycle_) + ") before every rank answered");
}

const SaveState* CommitRule::Find(uint64_t number) const {
  auto found = saves_.find(number);
  return found == saves_.end() ? nullptr : &found->second;
}

Decision CommitRule::DecisionOf(uint64_t number) const {
  const SaveState* save = Find(number);
  return save == nullptr ? Decision::kPending : save->decision;
}

std::vector<int> CommitRule::Missing(uint64_t number) const {
  const SaveState* save = Find(number);
  std::vector<int> missing;
  for (int rank = 0; rank < rank_count_; ++rank) {
    if (save == nullptr || !save->answers.contains(rank)) missing.push_back(rank);
  }
  return missing;
}

// Counted by rank: every rank's one answer, a version or "no part", commits; one "lost" (or a
// rank whose launcher was replaced before it answered) abandons at once.
void CommitRule::Settle(SaveState& save) {
  if (save.decision != Decision::kPending) return;
  int answered = 0;
  for (int rank = 0; rank < rank_count_; ++rank) {
    auto part = save.answers.find(rank);
    if (part == save.answers.end()) {
      if (IncarnationAt(rank, save.declaration.cycle) != Incarnation(rank)) {
        return Decide(save, Decision::kAbandon, "the launcher of rank " + std::to_string(rank) +
                                                    " was replaced before it answered (its part is lost)");
      }
      continue;
    }
    if (part->second.kind == PartKind::kLost) {
      return Decide(save, Decision::kAbandon, "rank " + std::to_string(rank) + "'s part of this save is lost");
    }
    ++answered;
  }
  if (answered == rank_count_) Decide(save, Decision::kCommit, "every rank answered");
}

void CommitRule::Decide(SaveState& save, Decision decision, std::string why) {
  save.decision = decision;
  save.why = std::move(why);
  if (decision != Decision::kCommit) return;
  // Committing an older open save of this name afterwards would move the name back.
  for (auto& [number, older] : saves_) {
    if (number >= save.declaration.number) break;
    if (older.decision != Decision::kPending || older.declaration.name != save.declaration.name) continue;
    older.decision = Decision::kAbandon;
    older.why = "superseded by the later save " + save.declaration.save + " of " + save.declaration.name;
  }
}

}  // namespace bt::checkpoint
