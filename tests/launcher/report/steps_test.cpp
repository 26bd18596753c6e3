// Step figures (launcher/report/steps.h): the step source both ways (a regex over output lines,
// a heartbeat file's value), steps done and redone, percentiles, and a straggler named.
#include "launcher/report/steps.h"

#include <stdexcept>

#include <gtest/gtest.h>

namespace bt::launcher::report {
namespace {

// A node that takes `seconds_per_step` per step from `first` to `last`, starting at `t0`.
NodeSteps Steady(int node, double t0, int64_t first, int64_t last, double seconds_per_step) {
  NodeSteps steps{node, {}};
  for (int64_t step = first; step <= last; ++step) steps.samples.push_back({t0 + double(step - first) * seconds_per_step, step});
  return steps;
}

TEST(StepPattern, TakesItsOneGroupAsTheStep) {
  const StepPattern pattern(R"(step[ =](\d+))");
  EXPECT_EQ(pattern.Match("[rank0] step 1234 loss 2.31"), 1234);
  EXPECT_EQ(pattern.Match("global step=7"), 7);
  EXPECT_EQ(pattern.Match("loss 2.31"), std::nullopt);
}

TEST(StepPattern, AGroupThatIsNoIntegerIsNoStep) {
  const StepPattern pattern(R"(step (\S+))");
  EXPECT_EQ(pattern.Match("step abc"), std::nullopt);
  EXPECT_EQ(pattern.Match("step 99999999999999999999999"), std::nullopt);
}

TEST(StepPattern, NeedsExactlyOneGroupAndAValidRegex) {
  EXPECT_THROW(StepPattern("step \\d+"), std::invalid_argument);
  EXPECT_THROW(StepPattern("(step) (\\d+)"), std::invalid_argument);
  try {
    StepPattern bad("step ((\\d+)");
    FAIL() << "an unbalanced group compiled";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("step_pattern"), std::string::npos) << error.what();
  }
}

TEST(HeartbeatStep, ABareNumberOrAJsonStep) {
  EXPECT_EQ(ParseHeartbeatStep("1234\n"), 1234);
  EXPECT_EQ(ParseHeartbeatStep(" 7 "), 7);
  EXPECT_EQ(ParseHeartbeatStep(R"({"step": 42, "loss": 1.5})"), 42);
  EXPECT_EQ(ParseHeartbeatStep(""), std::nullopt);
  EXPECT_EQ(ParseHeartbeatStep("12a"), std::nullopt);
  EXPECT_EQ(ParseHeartbeatStep(R"({"step": "42"})"), std::nullopt);
  EXPECT_EQ(ParseHeartbeatStep(R"({"step": 4)"), std::nullopt);
}

TEST(StepStats, NamesTheNodeSlowerThanTheOthers) {
  const double fast = 0.5, slow = 0.7;
  const auto stats = ComputeStepStats({Steady(0, 0, 0, 100, fast), Steady(1, 0, 0, 100, fast), Steady(2, 0, 0, 70, slow)}, 1.2);
  ASSERT_TRUE(stats);
  ASSERT_TRUE(stats->straggler_node);
  EXPECT_EQ(*stats->straggler_node, 2);
  EXPECT_NEAR(stats->straggler_ratio, slow / fast, 1e-9);
  EXPECT_NEAR(stats->step_p50_s, fast, 1e-9);
  EXPECT_NEAR(stats->step_p95_s, slow, 1e-9);
  EXPECT_EQ(stats->steps_done, 100);
  EXPECT_EQ(stats->steps_redone, 0);
}

TEST(StepStats, NoStragglerWithinTheRatio) {
  const auto stats = ComputeStepStats({Steady(0, 0, 0, 50, 0.5), Steady(1, 0, 0, 50, 0.55)}, 1.2);
  ASSERT_TRUE(stats);
  EXPECT_FALSE(stats->straggler_node);
}

TEST(StepStats, StepsRedoneAfterARestartWentBackToACheckpoint) {
  // Reached step 100, the restart resumed from step 80 after 30 s away, then went on to 150.
  NodeSteps node = Steady(0, 0, 0, 100, 1.0);
  const NodeSteps resumed = Steady(0, 130, 80, 150, 1.0);
  node.samples.insert(node.samples.end(), resumed.samples.begin(), resumed.samples.end());
  const auto stats = ComputeStepStats({node}, 1.2);
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->steps_done, 150);
  EXPECT_EQ(stats->steps_redone, 100 - 80);
  // The 30 s away is no step time.
  EXPECT_NEAR(stats->step_p95_s, 1.0, 1e-9);
}

TEST(StepStats, BothSourcesGiveTheSameFigures) {
  // The same progress seen as output lines through the pattern and as heartbeat file values.
  const StepPattern pattern(R"(it (\d+)/)");
  NodeSteps from_lines{0, {}};
  NodeSteps from_heartbeat{0, {}};
  for (int step = 0; step <= 20; ++step) {
    const double time_s = 3 + 0.25 * step;
    if (auto parsed = pattern.Match("train: it " + std::to_string(step) + "/1000 loss=1.0")) {
      from_lines.samples.push_back({time_s, *parsed});
    }
    if (auto parsed = ParseHeartbeatStep("{\"step\": " + std::to_string(step) + "}")) {
      from_heartbeat.samples.push_back({time_s, *parsed});
    }
  }
  const auto by_lines = ComputeStepStats({from_lines}, 1.2);
  const auto by_heartbeat = ComputeStepStats({from_heartbeat}, 1.2);
  ASSERT_TRUE(by_lines && by_heartbeat);
  EXPECT_EQ(by_lines->steps_done, 20);
  EXPECT_EQ(by_lines->steps_done, by_heartbeat->steps_done);
  EXPECT_DOUBLE_EQ(by_lines->step_p50_s, by_heartbeat->step_p50_s);
  EXPECT_NEAR(by_lines->step_p50_s, 0.25, 1e-9);
}

TEST(StepStats, NothingToSayWithoutTwoSamples) {
  EXPECT_FALSE(ComputeStepStats({}, 1.2));
  EXPECT_FALSE(ComputeStepStats({NodeSteps{0, {{1.0, 5}}}}, 1.2));
}

TEST(StepStats, GoodputCarriesThemWhenTheRecordHasSteps) {
  JobRecord record;
  record.wall_end_s = 100;
  record.steps = {Steady(0, 0, 0, 10, 1.0), Steady(1, 0, 0, 10, 2.0)};
  const Goodput goodput = ComputeGoodput(record);
  ASSERT_TRUE(goodput.steps);
  EXPECT_EQ(goodput.steps->straggler_node, 1);
  EXPECT_NE(FormatGoodputTable(goodput).find("straggler: node 1"), std::string::npos) << FormatGoodputTable(goodput);
}

}  // namespace
}  // namespace bt::launcher::report

namespace bt::launcher::report {
namespace {

// Review 10, F3: a job resumed right after the last step it printed (step 6 before the fault,
// step 7 after the restart): the interval holds the restart, not a step.
TEST(StepStats, NoStepTimeSpansARestart) {
  NodeSteps node{0, {}};
  for (int64_t step = 1; step <= 6; ++step) node.samples.push_back({0.3 * double(step), step, 0});
  for (int64_t step = 7; step <= 12; ++step) node.samples.push_back({6.0 + 0.3 * double(step - 7), step, 1});
  const std::optional<StepStats> stats = ComputeStepStats({node}, 1.2);
  ASSERT_TRUE(stats);
  EXPECT_EQ(stats->steps_done, 11);
  EXPECT_NEAR(stats->step_p95_s, 0.3, 1e-9);
  EXPECT_EQ(stats->nodes[0].intervals, 10);
}

}  // namespace
}  // namespace bt::launcher::report
