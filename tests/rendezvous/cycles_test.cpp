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

}  // namespace
}  // namespace bt::rendezvous
