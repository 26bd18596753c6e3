// The leader's cycle number, its restart frame and the barrier before each cycle.
#include "rendezvous/cycles.h"

#include <chrono>
#include <thread>

#include <gtest/gtest.h>

namespace bt::rendezvous {
namespace {

RestartPolicy Always() {
  return [](const CycleFailure&) { return RestartAnswer{Message{{"resume", ""}}, ""}; };
}

TEST(Cycles, ARestartAdvancesTheCycleAndMakesEarlierMessagesStale) {
  Cycles cycles(3, Always());
  std::string refusal;
  auto restart = cycles.Decide({0, 2, "gpu2", "node 2 failed", 1}, refusal);
  ASSERT_TRUE(restart);
  EXPECT_EQ((*restart)["op"], "restart");
  EXPECT_EQ((*restart)["cycle"], 1);
  EXPECT_EQ((*restart)["rank"], 2);
  EXPECT_EQ((*restart)["host"], "gpu2");
  EXPECT_EQ(cycles.current(), 1);
  EXPECT_TRUE(cycles.IsStale(0));
  EXPECT_FALSE(cycles.IsStale(1));
}

TEST(Cycles, TheBarrierOpensOnceWhenEveryNodeHasArrived) {
  Cycles cycles(3, Always());
  std::string refusal;
  ASSERT_TRUE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_FALSE(cycles.Arrive(0));
  EXPECT_FALSE(cycles.Arrive(0));  // twice is once
  EXPECT_FALSE(cycles.Arrive(2));
  auto go = cycles.Arrive(1);
  ASSERT_TRUE(go);
  EXPECT_EQ((*go)["op"], "cycle_go");
  EXPECT_EQ((*go)["cycle"], 1);
  EXPECT_FALSE(cycles.Arrive(1));
}

TEST(Cycles, ANewRestartStartsTheBarrierOver) {
  Cycles cycles(2, Always());
  std::string refusal;
  ASSERT_TRUE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_FALSE(cycles.Arrive(0));
  ASSERT_TRUE(cycles.Decide({1, 1, "h", "c", 1}, refusal));  // a second failure during the restart
  EXPECT_FALSE(cycles.Arrive(1));  // node 0's arrival was for cycle 1, not 2
  EXPECT_TRUE(cycles.Arrive(0));
}

// A launcher lost at the barrier: its arrival is undone and the cycle stays the same, so
// the barrier opens only once a launcher in its rank has arrived again.
TEST(Cycles, ANodeThatLeavesTheBarrierIsAwaitedAgainInTheSameCycle) {
  Cycles cycles(2, Always());
  std::string refusal;
  ASSERT_TRUE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_FALSE(cycles.Arrive(1));
  cycles.Leave(1);
  cycles.Leave(1);  // twice is once
  EXPECT_EQ(cycles.Awaited(), (std::vector<int>{0, 1}));
  EXPECT_FALSE(cycles.Arrive(0));
  auto go = cycles.Arrive(1);
  ASSERT_TRUE(go);
  EXPECT_EQ((*go)["cycle"], 1);
  EXPECT_EQ(cycles.current(), 1);
}

// The restart's figures count from the decision; the decision's own time is said beside them.
TEST(Cycles, TheRestartSaysHowLongTheDecisionTook) {
  Cycles cycles(2, [](const CycleFailure&) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return RestartAnswer{Message{{"resume", ""}}, ""};
  });
  std::string refusal;
  auto restart = cycles.Decide({0, 1, "h", "c", 1}, refusal);
  ASSERT_TRUE(restart);
  ASSERT_TRUE((*restart)["decision"].contains("decided_in_s")) << restart->dump();
  EXPECT_GE((*restart)["decision"]["decided_in_s"].get<double>(), 0.02);
}

TEST(Cycles, ARefusalIsPassedOnAndTheCycleStays) {
  Cycles cycles(2, [](const CycleFailure&) { return RestartAnswer{std::nullopt, "no restart left"}; });
  std::string refusal;
  EXPECT_FALSE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_EQ(refusal, "no restart left");
  EXPECT_EQ(cycles.current(), 0);
}

TEST(Cycles, WithoutAPolicyNothingRestarts) {
  Cycles cycles(2, nullptr);
  std::string refusal;
  EXPECT_FALSE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
}


// Hot spares (launcher.spares): 3 slots, 2 ranks. Slot 2 runs nothing until a rank moves to it.
TEST(RankAssignment, SlotsStartWithTheirOwnRankAndTheRestAreSpares) {
  RankAssignment assignment(3, 2);
  EXPECT_EQ(assignment.RankOf(0), 0);
  EXPECT_EQ(assignment.RankOf(1), 1);
  EXPECT_TRUE(assignment.IsSpare(2));
  EXPECT_TRUE(assignment.IsSpare(3));  // out of range: no rank
  EXPECT_EQ(assignment.Slots(), (std::vector<int>{0, 1}));
  assignment.Move(1, 2);
  EXPECT_TRUE(assignment.IsSpare(1));
  EXPECT_EQ(assignment.RankOf(2), 1);
  EXPECT_EQ(assignment.SlotOf(1), 2);
  EXPECT_EQ(assignment.Slots(), (std::vector<int>{0, 2}));
  assignment.Move(0, 2);  // 2 is no spare now: nothing moves
  EXPECT_EQ(assignment.RankOf(0), 0);
  EXPECT_EQ(assignment.RankOf(2), 1);
}

// Node 0 that cannot train at the start gives rank 0 to a spare like any node; a list that
// is no assignment is refused naming what is wrong.
TEST(RankAssignment, StartRanksMayPutRankZeroOnASpare) {
  EXPECT_EQ(ParseStartRanks("[2, 1]", 3, 2), (std::vector<int>{2, 1}));
  const RankAssignment assignment = RankAssignment::FromSlots(3, {2, 1});
  EXPECT_TRUE(assignment.IsSpare(0));
  EXPECT_EQ(assignment.SlotOf(0), 2);
  EXPECT_THROW(ParseStartRanks("[1, 1]", 3, 2), FrameError);
  EXPECT_THROW(ParseStartRanks("[3, 1]", 3, 2), FrameError);
  EXPECT_THROW(ParseStartRanks("[0]", 3, 2), FrameError);
}

TEST(Cycles, ASparesArrivalNeitherOpensNorHoldsTheBarrier) {
  Cycles cycles(3, 2, Always());
  std::string refusal;
  ASSERT_TRUE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_EQ(cycles.Awaited(), (std::vector<int>{0, 1}));
  EXPECT_FALSE(cycles.Arrive(2));
  EXPECT_FALSE(cycles.Arrive(0));
  EXPECT_TRUE(cycles.Arrive(1));
}

// The rank moves while the barrier waits: the spare is awaited, the slot that left is not,
// and its arrival (were it there) no longer counts.
TEST(Cycles, APromotedSpareIsAwaitedInsteadOfTheSlotItReplaces) {
  Cycles cycles(3, 2, Always());
  std::string refusal;
  ASSERT_TRUE(cycles.Decide({0, 1, "h", "c", 1}, refusal));
  EXPECT_FALSE(cycles.Arrive(1));
  cycles.Promote(1, 2);
  EXPECT_EQ(cycles.Awaited(), (std::vector<int>{0, 2}));
  EXPECT_FALSE(cycles.Arrive(0));
  EXPECT_TRUE(cycles.Arrive(2));
}

TEST(Cycles, ANodeLeavesForItsHardwareItsLossOrItsFailuresOverTheLimit) {
  Cycles cycles(3, 2, Always(), 2);
  EXPECT_EQ(cycles.CountFailure({0, 1, "h", "c", 75, false, true}), "its hardware cannot train");
  EXPECT_EQ(cycles.CountFailure({0, 1, "h", "c", 75}), "it failed 2 cycles (launcher.restart.max_failures_per_node)")
      << "a job that exits 75 itself is a failure as any other";
  EXPECT_EQ(cycles.CountFailure({0, 0, "h", "c", 0, true}), "its launcher was lost");
  EXPECT_EQ(cycles.CountFailure({0, 0, "h", "c", 3}), "it failed 2 cycles (launcher.restart.max_failures_per_node)");
  // A node whose rank moved leaves; the next launcher in its slot starts with no failure.
  Cycles moved(3, 2, Always(), 2);
  EXPECT_EQ(moved.CountFailure({0, 1, "h", "c", 3}), "");
  moved.Promote(1, 2);
  moved.Promote(2, 1);
  EXPECT_EQ(moved.CountFailure({1, 1, "h", "c", 3}), "");
  moved.ForgetFailures(1);
  EXPECT_EQ(moved.CountFailure({2, 1, "h", "c", 3}), "");
  Cycles fresh(3, 2, Always(), 2);
  EXPECT_EQ(fresh.CountFailure({0, 1, "h", "c", 3}), "");  // the first failure restarts in place
  EXPECT_NE(fresh.CountFailure({1, 1, "h", "c", 3}), "");
}

}  // namespace
}  // namespace bt::rendezvous
