// Node 0's restart budget (launcher.restart), asked as the leader's server asks it.
#include "launcher/supervision/restart.h"

#include <gtest/gtest.h>

namespace bt::launcher {
namespace {

rendezvous::CycleFailure FailureOf(int64_t cycle, int rank) { return {cycle, rank, "host" + std::to_string(rank), "failed", 1}; }

TEST(RestartPolicy, TheBudgetIsTheJobsWhicheverNodeFails) {
  env::RestartSettings settings;
  settings.max_restarts = 2;
  auto policy = MakeRestartPolicy(settings, nullptr);
  auto first = policy(FailureOf(0, 1));
  auto second = policy(FailureOf(1, 2));
  auto third = policy(FailureOf(2, 0));
  ASSERT_TRUE(first.decision);
  EXPECT_EQ((*first.decision)["restarts_used"], 1);
  ASSERT_TRUE(second.decision);
  EXPECT_EQ((*second.decision)["restarts_used"], 2);
  EXPECT_FALSE(third.decision);
  EXPECT_EQ(third.refusal, "no restart left (2/2 used, launcher.restart.max_restarts)");
}

TEST(RestartPolicy, ResumesFromTheLatestCommittedCheckpointAtTheDecision) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  std::optional<std::string> latest;
  auto policy = MakeRestartPolicy(settings, [&] { return latest; });
  latest = "checkpoint-10";
  auto answer = policy(FailureOf(0, 1));
  ASSERT_TRUE(answer.decision);
  EXPECT_EQ((*answer.decision)["resume"], "checkpoint-10");
}

TEST(RestartPolicy, StopsAfterCyclesInARowWithoutANewCommittedCheckpoint) {
  env::RestartSettings settings;
  settings.max_restarts = 10;
  settings.max_cycles_without_progress = 2;
  std::optional<std::string> latest = "checkpoint-1";
  auto policy = MakeRestartPolicy(settings, [&] { return latest; });
  EXPECT_TRUE(policy(FailureOf(0, 1)).decision);  // cycle 0 committed nothing new: 1 in a row
  latest = "checkpoint-2";
  EXPECT_TRUE(policy(FailureOf(1, 1)).decision);  // progress: the count starts over
  EXPECT_TRUE(policy(FailureOf(2, 1)).decision);  // 1 in a row
  auto answer = policy(FailureOf(3, 1));          // 2 in a row
  EXPECT_FALSE(answer.decision);
  EXPECT_NE(answer.refusal.find("2 cycles in a row ended without a new committed checkpoint"), std::string::npos)
      << answer.refusal;
}

TEST(CycleEnviron, EveryCycleCarriesItsCountAndItsOwnMasterPort) {
  env::JobConfig config;
  config.launcher.restart.max_restarts = 3;
  env::JobEnvironment environment;
  environment.variables = {{"MASTER_PORT", "29500"}};
  auto environ = CycleEnviron(environment, config, 2, "checkpoint-7");
  auto has = [&](const std::string& entry) { return std::find(environ.begin(), environ.end(), entry) != environ.end(); };
  EXPECT_TRUE(has("BT_RESTART_COUNT=2"));
  EXPECT_TRUE(has("TORCHELASTIC_RESTART_COUNT=2"));
  EXPECT_TRUE(has("BT_RESUME_CHECKPOINT=checkpoint-7"));
  EXPECT_TRUE(has("MASTER_PORT=29502"));
}

TEST(CycleEnviron, WithoutRestartsTheEnvironmentIsTodays) {
  env::JobConfig config;
  env::JobEnvironment environment;
  environment.variables = {{"MASTER_PORT", "29500"}};
  EXPECT_EQ(CycleEnviron(environment, config, 0, ""), environment.ToEnviron());
}

}  // namespace
}  // namespace bt::launcher
