// The commit rule's state machine: the reproduced defects as single scenarios, then every
// sequence of declare / answer / replace / restart a small model can make (2 ranks, 2 saves of
// one name, answers truthful or not: from a stale launcher, telling of the wrong cycle), with
// the invariants of DESIGN.md §3 checked after every step; and every order of a
// restart with a replaced rank around two saves.
#include <atomic>
#include <chrono>
#include <functional>
#include <thread>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "checkpoint/commit_gate.h"
#include "checkpoint/commit_rule.h"

namespace bt::checkpoint {
namespace {

SaveDeclaration Save(uint64_t number, int64_t cycle, const std::string& name = "checkpoint-2") {
  return {number, name, "save-" + std::to_string(number), cycle};
}

PartAnswer Version(int rank, uint64_t declaration, int64_t cycle, int64_t incarnation = 0) {
  return {rank, declaration, incarnation, cycle, PartKind::kVersion, "v" + std::to_string(rank) + "-" + std::to_string(cycle)};
}

PartAnswer NoPart(int rank, uint64_t declaration, int64_t cycle, int64_t incarnation = 0) {
  return {rank, declaration, incarnation, cycle, PartKind::kNoPart, ""};
}

PartAnswer Lost(int rank, uint64_t declaration, int64_t cycle, int64_t incarnation = 0) {
  return {rank, declaration, incarnation, cycle, PartKind::kLost, ""};
}

TEST(CommitRule, CommitsWhenEveryRankAnsweredWithAVersionOrNoPart) {
  CommitRule rule(3);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  EXPECT_TRUE(rule.Answer(NoPart(2, 0, 0)));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kPending);
  EXPECT_EQ(rule.Missing(0), std::vector<int>{1});
  EXPECT_TRUE(rule.Answer(Version(1, 0, 0)));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kCommit);
  EXPECT_EQ(rule.Find(0)->answers.at(2).kind, PartKind::kNoPart);
}

TEST(CommitRule, OneLostPartAbandonsTheSaveAtOnce) {
  CommitRule rule(3);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Lost(2, 0, 0)));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
  EXPECT_FALSE(rule.Answer(Version(0, 0, 0)));
}

// Defect 4: a second answer for a rank (a replacement's) neither replaces the first nor
// counts towards the others: node 2 never answered, so nothing commits.
TEST(CommitRule, CountsRanksNotAnswers) {
  CommitRule rule(3);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  EXPECT_TRUE(rule.Answer(Version(1, 0, 0)));
  EXPECT_FALSE(rule.Answer(NoPart(1, 0, 0)));
  EXPECT_FALSE(rule.Answer(Version(1, 0, 0)));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kPending);
  EXPECT_EQ(rule.Find(0)->answers.at(1).version, "v1-0");
}

// Defect 3: a replacement answers "no part" for the save its lost predecessor was writing:
// it is not that launcher's to answer; the rank's part is lost and the save is abandoned.
TEST(CommitRule, AReplacementNeverAnswersItsPredecessorsSave) {
  CommitRule rule(2);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  rule.Restart(1);
  rule.Replace(1, 1);
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
  EXPECT_FALSE(rule.Answer(NoPart(1, 0, 1, 1)));
}

// Defect 2: a declaration left open across a restart is never completed by a part of the new
// cycle; the answer that tells of the new cycle makes it lost.
TEST(CommitRule, APartOfALaterCycleNeverCompletesAnEarlierSave) {
  CommitRule rule(2);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  EXPECT_TRUE(rule.Answer(Version(1, 0, 1)));  // seen in cycle 1, before node 0's rule heard of it
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
}

// Soak finding F5: node 0's restart decision named the newest commit (step 8); a save of the
// failed cycle (step 12) committed after it, and the new cycle's re-save of step 9 moved
// `latest` back from 12 to 9. A restart abandons every open save of the cycles before it,
// even one whose part of its own cycle arrives late.
TEST(CommitRule, ARestartAbandonsTheOpenSavesOfEarlierCycles) {
  CommitRule rule(2);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  rule.Restart(1);
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
  EXPECT_FALSE(rule.Answer(Version(1, 0, 0)));  // uploaded late, written in cycle 0
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
}

// Node 0's own part of the failed cycle, uploaded only after the restart, is declared then:
// it never commits either.
TEST(CommitRule, ASaveOfAnEarlierCycleDeclaredAfterTheRestartIsAbandoned) {
  CommitRule rule(2);
  rule.Restart(1);
  rule.Declare(Save(0, 0));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
  rule.Declare(Save(1, 1));
  EXPECT_TRUE(rule.Answer(Version(0, 1, 1)));
  EXPECT_TRUE(rule.Answer(Version(1, 1, 1)));
  EXPECT_EQ(rule.DecisionOf(1), Decision::kCommit);
}

// A stale launcher (replaced, still running behind a partition) is never heard again.
TEST(CommitRule, AStaleLaunchersLateAnswerIsIgnored) {
  CommitRule rule(2);
  rule.Restart(1);
  rule.Replace(1, 1);
  rule.Declare(Save(0, 1));
  EXPECT_FALSE(rule.Answer(Version(1, 0, 1, /*incarnation=*/0)));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 1)));
  EXPECT_TRUE(rule.Answer(Version(1, 0, 1, 1)));
  EXPECT_EQ(rule.DecisionOf(0), Decision::kCommit);
}

// Defect 30: the name saved again in the next cycle; once the later save commits, the
// earlier one can never complete, and nothing waits for it.
TEST(CommitRule, ALaterSaveOfTheNameCommittedAbandonsTheEarlierOne) {
  CommitRule rule(2);
  rule.Declare(Save(0, 0));
  EXPECT_TRUE(rule.Answer(Version(0, 0, 0)));
  rule.Restart(1);
  rule.Declare(Save(1, 1));
  EXPECT_TRUE(rule.Answer(Version(0, 1, 1)));
  EXPECT_TRUE(rule.Answer(Version(1, 1, 1)));
  EXPECT_EQ(rule.DecisionOf(1), Decision::kCommit);
  EXPECT_EQ(rule.DecisionOf(0), Decision::kAbandon);
  EXPECT_FALSE(rule.Answer(Version(1, 0, 0)));
}

// ---- Node 0's restart decision against its commits (CommitGate) ------------------------

storage::CommitRecord Record(const std::string& name) {
  storage::CommitRecord record;
  record.job_id = "job";
  record.name = name;
  return record;
}

// Soak finding F5, the race: a save of the failed cycle began committing while node 0 decided
// the restart. The decision waits for it before it reads `latest`, and a save of the failed
// cycle that had not begun never commits after the decision.
TEST(CommitGate, TheDecisionWaitsForACommitBegunAndNoSaveOfTheSealedCycleBeginsAfter) {
  CommitGate gate;
  gate.EnterCycle(0);
  ASSERT_TRUE(gate.TryBegin(1, 0, Record("checkpoint-1")));
  std::atomic<bool> sealed = false;
  std::thread decision([&] {
    EXPECT_EQ(gate.Seal(std::chrono::seconds(10)), std::nullopt);
    sealed = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(sealed) << "the decision read `latest` while a commit was on its way";
  gate.Finished(1);
  decision.join();
  EXPECT_FALSE(gate.TryBegin(2, 0, Record("checkpoint-2"))) << "a save of the failed cycle began committing after the decision";
  gate.EnterCycle(1);
  EXPECT_TRUE(gate.TryBegin(3, 1, Record("checkpoint-3")));
}

TEST(CommitGate, BeforeTheAgentRunsACycleNothingIsSealed) {
  CommitGate gate;
  EXPECT_EQ(gate.Seal(std::chrono::milliseconds(0)), std::nullopt);
  gate.EnterCycle(0);
  EXPECT_TRUE(gate.TryBegin(1, 0, Record("checkpoint-1")));
  EXPECT_NE(gate.Seal(std::chrono::milliseconds(10)), std::nullopt) << "a commit still on its way";
}

// Soak seed 301 (s3): two commits were on their way past the wait; the decision named the
// one before them, they were written after it, and the next cycle's re-saves moved `latest`
// back (7 to 6). Now the decision names the newest one on its way, as `latest` will.
TEST(CommitGate, ACommitStillOnItsWayAfterTheWaitIsTheOneTheDecisionNames) {
  CommitGate gate;
  gate.EnterCycle(0);
  ASSERT_TRUE(gate.TryBegin(6, 0, Record("checkpoint-6")));
  ASSERT_TRUE(gate.TryBegin(7, 0, Record("checkpoint-7")));
  const auto named = gate.Seal(std::chrono::milliseconds(10));
  ASSERT_TRUE(named);
  EXPECT_EQ(named->name, "checkpoint-7");
}

// A later save decided first: its commit is written while an older one is still on its way.
// `latest` names the later one and stays: the older is no resume point.
TEST(CommitGate, AnOlderCommitOnItsWayBehindANewerOneWrittenIsNotNamed) {
  CommitGate gate;
  gate.EnterCycle(0);
  ASSERT_TRUE(gate.TryBegin(8, 0, Record("checkpoint-8")));
  ASSERT_TRUE(gate.TryBegin(7, 0, Record("checkpoint-7")));
  gate.Finished(8);
  EXPECT_EQ(gate.Seal(std::chrono::milliseconds(10)), std::nullopt);
}

// ---- The small model, every sequence -------------------------------------------------

constexpr int kRanks = 2;
constexpr int kSaves = 2;

struct Event {
  enum Kind { kDeclare, kRestart, kReplace, kAnswer } kind = kDeclare;
  int rank = 0;
  int save = 0;  // the n-th declaration
  PartKind part = PartKind::kVersion;
  bool tells_current_cycle = false;  // else the declaration's cycle
  bool from_first_launcher = false;  // else the launcher running the rank now
};

std::vector<Event> Alphabet() {
  std::vector<Event> events{{Event::kDeclare}, {Event::kRestart}};
  for (int rank = 0; rank < kRanks; ++rank) events.push_back({Event::kReplace, rank});
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int save = 0; save < kSaves; ++save) {
      for (PartKind part : {PartKind::kVersion, PartKind::kNoPart, PartKind::kLost}) {
        for (bool current_cycle : {false, true}) {
          for (bool first_launcher : {false, true}) {
            events.push_back({Event::kAnswer, rank, save, part, current_cycle, first_launcher});
          }
        }
      }
    }
  }
  return events;
}

// The world the rule is told about, and what the test saw it count.
struct Model {
  CommitRule rule{kRanks};
  int64_t cycle = 0;
  std::vector<int64_t> declared_cycle;                  // by declaration number
  std::map<int, std::vector<int64_t>> launchers;        // rank → joined cycles, increasing
  std::map<std::pair<uint64_t, int>, PartAnswer> counted;  // (save, rank) → the answer counted
  std::map<uint64_t, Decision> decided;
  std::set<uint64_t> committed_before_restart_;  // saves committed before the last restart

  Model() {
    for (int rank = 0; rank < kRanks; ++rank) launchers[rank] = {0};
  }

  int64_t RanAt(int rank, int64_t at) const {
    int64_t found = 0;
    for (int64_t joined : launchers.at(rank)) {
      if (joined <= at) found = joined;
    }
    return found;
  }

  // Applies `event`; false when it means nothing in this world (a third declaration).
  bool Apply(const Event& event, std::string& failure) {
    switch (event.kind) {
      case Event::kDeclare:
        if (declared_cycle.size() == size_t(kSaves)) return false;
        declared_cycle.push_back(cycle);
        rule.Declare(Save(declared_cycle.size() - 1, cycle));
        break;
      case Event::kRestart:
        if (cycle == 2) return false;
        for (const auto& [number, save] : rule.saves()) {
          if (save.decision == Decision::kCommit) committed_before_restart_.insert(number);
        }
        rule.Restart(++cycle);
        break;
      case Event::kReplace:
        // A replacement joins a cycle before that cycle's training runs: before any save of it.
        if (launchers[event.rank].back() == cycle) return false;
        if (!declared_cycle.empty() && declared_cycle.back() == cycle) return false;
        launchers[event.rank].push_back(cycle);
        rule.Replace(event.rank, cycle);
        break;
      case Event::kAnswer: {
        const uint64_t number = uint64_t(event.save);
        const int64_t declared = number < declared_cycle.size() ? declared_cycle[number] : cycle;
        PartAnswer answer{event.rank,
                          number,
                          event.from_first_launcher ? 0 : launchers[event.rank].back(),
                          event.tells_current_cycle ? cycle : declared,
                          event.part,
                          event.part == PartKind::kVersion ? "v" : ""};
        const bool was_counted = rule.Answer(answer);
        if (was_counted) {
          if (number >= declared_cycle.size()) failure = "an answer to a save never declared counted";
          if (!counted.emplace(std::pair(number, event.rank), answer).second) failure = "two answers of one rank counted";
        }
        break;
      }
    }
    return true;
  }

  // DESIGN.md §3's invariants over the rule's state now.
  std::string Violation() {
    for (const auto& [number, save] : rule.saves()) {
      auto before = decided.find(number);
      if (before != decided.end() && before->second != save.decision) return "a decision changed";
      if (save.decision != Decision::kPending) decided[number] = save.decision;
      const int64_t declared = declared_cycle[number];
      bool all_answered = true;
      bool any_lost = false;
      for (int rank = 0; rank < kRanks; ++rank) {
        auto answer = counted.find({number, rank});
        const bool good = answer != counted.end() && answer->second.kind != PartKind::kLost &&
                          answer->second.cycle == declared && answer->second.incarnation == RanAt(rank, declared);
        if (save.decision == Decision::kCommit && !good) {
          return "save " + std::to_string(number) + " committed without a good answer of rank " + std::to_string(rank);
        }
        if (answer == counted.end()) {
          all_answered = false;
          any_lost |= launchers.at(rank).back() != RanAt(rank, declared);  // replaced before it answered
        } else {
          any_lost |= !good;
        }
      }
      if (any_lost && save.decision == Decision::kCommit) return "a save committed with a lost part";
      if (any_lost && save.decision == Decision::kPending) return "a save with a lost part left open";
      // A restart ends its cycle: nothing of it commits after node 0's decision.
      if (declared < cycle && save.decision == Decision::kPending) return "a save of an ended cycle left open";
      if (declared < cycle && save.decision == Decision::kCommit && !committed_before_restart_.contains(number)) {
        return "a save of an ended cycle committed after the restart";
      }
      // Progress: every rank answered well → committed, unless a later save of the name was,
      // or its cycle ended before the last answer.
      if (all_answered && !any_lost && save.decision != Decision::kCommit && declared == cycle) {
        bool superseded = false;
        for (const auto& [later, other] : rule.saves()) superseded |= later > number && other.decision == Decision::kCommit;
        if (!superseded) return "a save every rank answered is not committed";
      }
      if (save.decision == Decision::kCommit) {
        for (const auto& [later, other] : rule.saves()) {
          if (later > number && other.decision == Decision::kCommit && decided_order_.at(later) < decided_order_.at(number)) {
            return "an older save of the name committed after a newer one";
          }
        }
      }
    }
    return "";
  }

  void NoteDecisions(int step) {
    for (const auto& [number, save] : rule.saves()) {
      if (save.decision != Decision::kPending) decided_order_.emplace(number, step);
    }
  }

  std::map<uint64_t, int> decided_order_;
};

std::string Describe(const std::vector<Event>& sequence) {
  std::string text;
  for (const Event& event : sequence) {
    switch (event.kind) {
      case Event::kDeclare: text += "declare; "; break;
      case Event::kRestart: text += "restart; "; break;
      case Event::kReplace: text += "replace " + std::to_string(event.rank) + "; "; break;
      case Event::kAnswer:
        text += "answer rank " + std::to_string(event.rank) + " save " + std::to_string(event.save) + " " +
                PartKindName(event.part) + (event.tells_current_cycle ? " (current cycle)" : "") +
                (event.from_first_launcher ? " (first launcher)" : "") + "; ";
        break;
    }
  }
  return text;
}

// Depth-first over every sequence of up to `depth` events, the model copied at each step.
void Explore(const Model& model, const std::vector<Event>& alphabet, std::vector<Event>& sequence, int depth,
             int64_t& sequences, std::string& first_failure) {
  if (!first_failure.empty()) return;
  ++sequences;
  if (depth == 0) return;
  for (const Event& event : alphabet) {
    Model next = model;
    std::string failure;
    if (!next.Apply(event, failure)) continue;
    sequence.push_back(event);
    next.NoteDecisions(int(sequence.size()));
    if (failure.empty()) failure = next.Violation();
    if (!failure.empty()) {
      first_failure = failure + " after: " + Describe(sequence);
      return;
    }
    Explore(next, alphabet, sequence, depth - 1, sequences, first_failure);
    sequence.pop_back();
  }
}

TEST(CommitRuleModel, EverySequenceOfUpToFourEventsKeepsTheInvariants) {
  const std::vector<Event> alphabet = Alphabet();
  std::vector<Event> sequence;
  int64_t sequences = 0;
  std::string failure;
  Explore(Model(), alphabet, sequence, 4, sequences, failure);
  EXPECT_EQ(failure, "");
  EXPECT_GT(sequences, 100'000);
}

// The events of two saves around a restart with a replaced rank, each truthful, in every
// order: whatever the order, nothing mixes, nothing commits without a rank.
TEST(CommitRuleModel, EveryOrderOfARestartWithAReplacementKeepsTheInvariants) {
  std::vector<Event> events = {
      {Event::kDeclare},
      {Event::kDeclare},
      {Event::kRestart},
      {Event::kReplace, 1},
      {Event::kAnswer, 0, 0, PartKind::kVersion},
      {Event::kAnswer, 1, 0, PartKind::kVersion},
      {Event::kAnswer, 0, 1, PartKind::kVersion},
      {Event::kAnswer, 1, 1, PartKind::kNoPart},
      {Event::kAnswer, 1, 0, PartKind::kLost},
  };
  std::vector<int> order(events.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int(i);
  int64_t orders = 0;
  do {
    Model model;
    std::vector<Event> sequence;
    for (int index : order) {
      std::string failure;
      if (!model.Apply(events[size_t(index)], failure)) continue;
      sequence.push_back(events[size_t(index)]);
      model.NoteDecisions(int(sequence.size()));
      if (failure.empty()) failure = model.Violation();
      ASSERT_EQ(failure, "") << Describe(sequence);
    }
    ++orders;
  } while (std::next_permutation(order.begin(), order.end()));
  EXPECT_EQ(orders, 362880);
}

}  // namespace
}  // namespace bt::checkpoint
