// Node 0's restart decision and a checkpoint leader on another launcher (rank 0 on a spare),
// meeting in node 0's table (rendezvous/commit_keys.h): each leader step and the decision's
// seal are one atomic step of the server there, so every order of them is one of these.
#include "rendezvous/commit_keys.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "rendezvous/store.h"

namespace bt::rendezvous {
namespace {

using Table = std::unordered_map<std::string, std::string>;

// Node 0's table as its server keeps it: the leader's steps (launcher/phases/commit_board.cpp)
// and the decision's seal (server.cpp), in the order a test gives them.
struct Board {
  Table table;
  int64_t sealed_through = -1;
  int64_t declared = 0;

  void Propose(uint64_t declaration, int64_t cycle, const std::string& record) {
    declared = std::max(declared, int64_t(declaration) + 1);
    table[CommitProposalKey(declaration)] = nlohmann::json{{"cycle", cycle}, {"record", record}}.dump();
  }
  int64_t Step(uint64_t declaration, int64_t cycle) {
    const std::string key = CommitStateKey(declaration, cycle);
    const std::string sealed = std::to_string(kCommitSealed);
    auto it = table.find(key);
    const std::string* stored = it != table.end() ? &it->second : BornSealed(key, sealed_through) ? &sealed : nullptr;
    const int64_t value = AddToCounter(key, stored, 1);
    table[key] = std::to_string(value);
    return value;
  }
  void Latest(uint64_t declaration, const std::string& record) {
    table[kCommitLatestKey] = nlohmann::json{{"declaration", declaration}, {"record", record}}.dump();
  }
  RemoteCommits Seal(int64_t cycle) {
    sealed_through = std::max(sealed_through, cycle);
    return ReadRemoteCommits(table, cycle, declared);
  }
};

TEST(RemoteCommits, NothingThereNamesNothing) {
  Board board;
  const RemoteCommits commits = board.Seal(3);
  EXPECT_FALSE(commits.latest);
  EXPECT_FALSE(commits.on_its_way);
}

TEST(RemoteCommits, ACommitBegunBeforeTheSealIsOnItsWayAndNamed) {
  Board board;
  board.Propose(0, 1, "first");
  ASSERT_EQ(board.Step(0, 1), 1);
  board.Latest(0, "first");
  ASSERT_EQ(board.Step(0, 1), 2);  // written
  board.Propose(1, 1, "second");
  ASSERT_EQ(board.Step(1, 1), 1);  // begun, not written
  const RemoteCommits commits = board.Seal(1);
  EXPECT_EQ(commits.latest, "first");
  EXPECT_EQ(commits.on_its_way, "second");
}

// The decision comes between the leader's proposal and its begin, or before both (a save of
// the failed cycle the leader was slow to declare): either way that commit never begins.
TEST(RemoteCommits, ASaveOfASealedCycleNeverBeginsAfterTheSeal) {
  Board board;
  board.Propose(0, 2, "proposed before");
  EXPECT_FALSE(board.Seal(2).on_its_way);
  EXPECT_GT(board.Step(0, 2), 1) << "the leader's begin must read the seal";
  board.Propose(1, 1, "proposed after, of an earlier cycle");
  EXPECT_GT(board.Step(1, 1), 1);
  EXPECT_FALSE(board.Seal(2).on_its_way);
}

TEST(RemoteCommits, ASaveOfALaterCycleIsNotSealed) {
  Board board;
  board.Seal(2);
  board.Propose(0, 3, "next cycle");
  EXPECT_EQ(board.Step(0, 3), 1);
  EXPECT_FALSE(board.Seal(2).on_its_way) << "a save of cycle 3 is no decision of cycle 2's";
  EXPECT_EQ(board.Seal(3).on_its_way, "next cycle");
}

TEST(RemoteCommits, AWrittenCommitNewerThanTheOneOnItsWayStaysLatest) {
  Board board;
  board.Propose(0, 1, "older");
  board.Step(0, 1);  // begun
  board.Propose(1, 1, "newer");
  board.Step(1, 1);
  board.Latest(1, "newer");
  board.Step(1, 1);  // written first
  const RemoteCommits commits = board.Seal(1);
  EXPECT_EQ(commits.latest, "newer");
  EXPECT_FALSE(commits.on_its_way);
}

// The launcher running rank 0 was lost with a commit begun: it may never be written, so no
// decision names it, and should that launcher come back its uploader asks first and is told
// no. Every save it declared gets its outcome, which followers' drains wait for.
TEST(RemoteCommits, ALostLeadersSavesAreSettledAndItsBegunCommitRevokedNotNamed) {
  Board board;
  for (uint64_t number : {0, 1, 2, 3}) {
    board.table[DeclarationKey(number)] = nlohmann::json{{"name", "c"}, {"save", "s"}, {"cycle", number < 3 ? 1 : 2}}.dump();
  }
  board.declared = 4;
  board.Propose(0, 1, "written");
  board.Step(0, 1);
  board.Latest(0, "written");
  board.Step(0, 1);  // the leader was lost before it set the outcome
  board.Propose(1, 1, "begun");
  ASSERT_EQ(board.Step(1, 1), 1);
  // Declaration 2: answered, never begun. Declaration 3: of a later cycle.
  SettleLostLeadersSaves(board.table, 0, 1, board.declared);
  const RemoteCommits commits = board.Seal(1);
  EXPECT_EQ(commits.latest, "written");
  EXPECT_FALSE(commits.on_its_way);
  EXPECT_NE(board.table[CommitStateKey(1, 1)], "1") << "its uploader's check must read no";
  EXPECT_EQ(board.table[CommitStateKey(0, 1)], "2") << "a written commit stays as it is";
  EXPECT_EQ(board.table[OutcomeKey(0)], std::to_string(kOutcomeCommitted));
  EXPECT_EQ(board.table[OutcomeKey(1)], std::to_string(kOutcomeAbandoned));
  EXPECT_EQ(board.table[OutcomeKey(2)], std::to_string(kOutcomeAbandoned));
  EXPECT_FALSE(board.table.contains(OutcomeKey(3)));
  MarkHandedOver(board.table, 2);
  MarkHandedOver(board.table, 1);
  EXPECT_EQ(board.table[kHandedOverKey], "2") << "the hand-over only moves forward";
}

// Review 16: rank 0 left node 0 in cycle 1 while node 0's agent still wrote declaration 0's
// commit (node 0 commits in-process: no state in the table); the spare that took rank 0 is
// lost. Only the spare's own saves (cycle 1 on) are settled: node 0's is node 0's to settle,
// and calling it abandoned while node 0 then wrote it left `latest` naming a save that every
// follower reported as not committed.
TEST(RemoteCommits, OnlyTheLostLeadersOwnSavesAreSettled) {
  Board board;
  board.table[DeclarationKey(0)] = nlohmann::json{{"name", "c"}, {"save", "s"}, {"cycle", 0}}.dump();
  board.table[DeclarationKey(1)] = nlohmann::json{{"name", "c"}, {"save", "s"}, {"cycle", 1}}.dump();
  board.declared = 2;
  SettleLostLeadersSaves(board.table, 1, 1, board.declared);
  EXPECT_FALSE(board.table.contains(OutcomeKey(0))) << "node 0's own save was settled by the spare's loss";
  EXPECT_EQ(board.table[OutcomeKey(1)], std::to_string(kOutcomeAbandoned));
}

TEST(RemoteCommits, OnlyCommitStatesAreBornSealed) {
  EXPECT_TRUE(BornSealed("bt/ckpt/commit/7/2", 2));
  EXPECT_TRUE(BornSealed("bt/ckpt/commit/7/0", 2));
  EXPECT_FALSE(BornSealed("bt/ckpt/commit/7/3", 2));
  EXPECT_FALSE(BornSealed("bt/ckpt/commit/7", 2));
  EXPECT_FALSE(BornSealed("bt/ckpt/commit/x/1", 2));
  EXPECT_FALSE(BornSealed("bt/ckpt/commit/7/1/extra", 2));
  EXPECT_FALSE(BornSealed("job/bt/ckpt/commit/7/1", 2));
  EXPECT_FALSE(BornSealed("bt/ckpt/commit/7/1", -1));
}

TEST(RemoteCommits, ValuesThatDoNotParseNameNothing) {
  Board board;
  board.declared = 2;
  board.table[kCommitLatestKey] = "not json";
  board.table[CommitProposalKey(0)] = R"({"cycle": "one", "record": 5})";
  board.table[CommitProposalKey(1)] = R"({"cycle": 1, "record": "r"})";
  board.table[CommitStateKey(1, 1)] = "many";
  const RemoteCommits commits = board.Seal(4);
  EXPECT_FALSE(commits.latest);
  EXPECT_FALSE(commits.on_its_way);
}

}  // namespace
}  // namespace bt::rendezvous
