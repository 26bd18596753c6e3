// The commit rule (DESIGN.md §3, "The commit rule, across cycles and replacements"), written
// once: which answers count for which save, and when a save is committed or abandoned. A
// pure state machine, no I/O: the store-backed board (launcher/phases/commit_board.h) reads
// what the nodes wrote and feeds it here in the order it read it; node 0's agent acts on the
// decision.
//
// A save is node 0's declaration (name, save id, cycle). Every rank answers it once: with the
// version it uploaded for that save, "no part", or "lost". An answer counts only when it comes
// from the launcher that ran that rank when the save was declared (its incarnation: the cycle
// it joined the job in) and tells of that save's cycle; the first that counts is the rank's
// answer, later ones are ignored. A launcher that replaced a lost one makes its predecessor's
// open saves lost for that rank. The save commits when every rank (counted by rank, never by
// answers) answered with a version or "no part"; one "lost" abandons it. A save committed
// makes every older open save of the same name abandoned (committing it after would move the
// name back to an older save). A restart abandons every save of the cycles before it that
// is still open.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bt::checkpoint {

struct SaveDeclaration {
  uint64_t number = 0;  // the board's, increasing
  std::string name;
  std::string save;     // node 0's version id of the save
  int64_t cycle = 0;    // the restart cycle node 0's part was written in
};

enum class PartKind { kVersion, kNoPart, kLost };
const char* PartKindName(PartKind kind);

struct PartAnswer {
  int rank = 0;
  uint64_t declaration = 0;
  int64_t incarnation = 0;  // the cycle the answering launcher joined the job in (0: from the start)
  int64_t cycle = 0;        // the cycle its part (or its absence) was seen in
  PartKind kind = PartKind::kLost;
  std::string version;      // kVersion only
};

enum class Decision { kPending, kCommit, kAbandon };
const char* DecisionName(Decision decision);

// One rank's counted answer to a save.
struct RankPart {
  PartKind kind = PartKind::kLost;
  std::string version;
  int64_t cycle = 0;
};

struct SaveState {
  SaveDeclaration declaration;
  Decision decision = Decision::kPending;
  std::map<int, RankPart> answers;  // by rank: the one answer that counts
  std::string why;                  // a decision's reason, for the log
};

class CommitRule {
 public:
  explicit CommitRule(int rank_count);

  int rank_count() const { return rank_count_; }
  int64_t cycle() const { return cycle_; }

  // Node 0 declared a save. A number seen already, or not after the last one, is ignored.
  void Declare(const SaveDeclaration& declaration);
  // Returns whether the answer counted (see the header's comment for when it does not).
  bool Answer(const PartAnswer& answer);
  // A launcher that joined in cycle `incarnation` runs `rank` from now on: every open save
  // declared before that cycle which the rank has not answered is lost for it, and answers
  // of earlier launchers of that rank are no longer taken.
  void Replace(int rank, int64_t incarnation);
  // The job entered `cycle`: node 0 decided the restart naming the newest commit there was,
  // so every open save of an earlier cycle is abandoned (committed after the decision, it
  // would make `latest` newer than what the new cycle resumes from, and the new cycle's
  // saves would then move `latest` back). A save of an earlier cycle declared later is
  // abandoned at once.
  void Restart(int64_t cycle);

  const SaveState* Find(uint64_t number) const;
  Decision DecisionOf(uint64_t number) const;
  // The ranks that have not answered a save yet (all of them for an unknown save).
  std::vector<int> Missing(uint64_t number) const;
  const std::map<uint64_t, SaveState>& saves() const { return saves_; }
  // The incarnation running `rank` now.
  int64_t Incarnation(int rank) const;

 private:
  // The launcher of `rank` that ran it when a save of `cycle` was declared.
  int64_t IncarnationAt(int rank, int64_t cycle) const;
  void Settle(SaveState& save);
  void EndedByRestart(SaveState& save);
  void Decide(SaveState& save, Decision decision, std::string why);

  int rank_count_;
  int64_t cycle_ = 0;
  uint64_t next_number_ = 0;
  std::map<uint64_t, SaveState> saves_;
  std::map<int, std::vector<int64_t>> incarnations_;  // by rank, increasing; 0 first
};

}  // namespace bt::checkpoint
