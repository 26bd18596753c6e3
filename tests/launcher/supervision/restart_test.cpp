// Node 0's restart budget (launcher.restart), asked as the leader's server asks it.
#include "launcher/supervision/restart.h"

#include <gtest/gtest.h>

#include "launcher/exit_codes.h"

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

storage::CommitRecord Commit(const std::string& name, std::map<int, std::string> parts) {
  storage::CommitRecord record;
  record.job_id = "job";
  record.name = name;
  record.parts = std::move(parts);
  return record;
}

// The decision carries the commit record itself, versions and all: a node that loads after
// a save committed under the same name still loads what the decision named.
TEST(RestartPolicy, TheDecisionNamesTheCommitRecordNodeZeroKnowsWithoutReadingTheDestination) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(std::nullopt);
  auto policy = MakeRestartPolicy(settings, committed);
  committed->Committed(Commit("checkpoint-10", {{0, "v0"}, {2, "v2"}}));
  auto answer = policy(FailureOf(0, 1));
  ASSERT_TRUE(answer.decision);
  EXPECT_EQ((*answer.decision)["resume"], "checkpoint-10");
  auto commit = ResumeCommitOf(*answer.decision);
  ASSERT_TRUE(commit);
  EXPECT_EQ(commit->name, "checkpoint-10");
  EXPECT_EQ(commit->parts, (std::map<int, std::string>{{0, "v0"}, {2, "v2"}}));  // rank 1: no part
  EXPECT_FALSE(commit->unversioned);
}

// The seal before the decision found a commit still on its way (its record and `latest` not
// written yet): the decision names it, not the one node 0 wrote last, or `latest` would be
// newer than what the next cycle resumes from (soak seeds 14, 301, 305).
TEST(RestartPolicy, TheDecisionNamesACommitStillOnItsWay) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(std::nullopt);
  committed->Committed(Commit("checkpoint-5", {{0, "v5"}}));
  committed->SealBeforeDecision([] { return std::optional<storage::CommitRecord>(Commit("checkpoint-7", {{0, "v7"}})); });
  auto answer = MakeRestartPolicy(settings, committed)(FailureOf(0, 1));
  ASSERT_TRUE(answer.decision);
  auto commit = ResumeCommitOf(*answer.decision);
  ASSERT_TRUE(commit);
  EXPECT_EQ(commit->name, "checkpoint-7");
  EXPECT_EQ(commit->parts, (std::map<int, std::string>{{0, "v7"}}));
}

// Rank 0 on a spare commits through node 0's table (rendezvous/commit_keys.h): what the
// server read there as it sealed the failed cycle is newer than anything node 0's own agent
// committed before rank 0 left it; a record there that does not parse names nothing.
TEST(RestartPolicy, TheDecisionNamesWhatTheLeaderOnASpareCommittedOrHasOnItsWay) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(std::nullopt);
  committed->Committed(Commit("checkpoint-5", {{0, "v5"}}));
  bool sealed = false;
  committed->SealBeforeDecision([&sealed] {
    sealed = true;
    return std::optional<storage::CommitRecord>();
  });
  auto policy = MakeRestartPolicy(settings, committed);
  auto named = [&](rendezvous::RemoteCommits remote) {
    rendezvous::CycleFailure failure = FailureOf(0, 1);
    failure.remote_commits = std::move(remote);
    auto answer = policy(failure);
    EXPECT_TRUE(answer.decision);
    auto commit = answer.decision ? ResumeCommitOf(*answer.decision) : std::nullopt;
    return commit ? commit->name : std::string("none");
  };
  EXPECT_EQ(named({Commit("checkpoint-8", {{0, "v8"}}).ToText(), std::nullopt}), "checkpoint-8");
  EXPECT_TRUE(sealed) << "node 0's own agent is sealed whatever the remote leader committed";
  EXPECT_EQ(named({Commit("checkpoint-8", {{0, "v8"}}).ToText(), Commit("checkpoint-9", {{0, "v9"}}).ToText()}),
            "checkpoint-9");
  EXPECT_EQ(named({std::string("{not a record"), std::nullopt}), "checkpoint-5");
}

TEST(CycleEnviron, MasterAddrFollowsRankZeroOnlyWhereTheLauncherSetIt) {
  env::JobConfig config;
  env::JobEnvironment environment;
  environment.variables = {{"MASTER_ADDR", "10.0.0.1"}, {"BT_LEADER_ADDR", "10.0.0.1"}};
  auto has = [](const std::vector<std::string>& environ, const std::string& entry) {
    return std::find(environ.begin(), environ.end(), entry) != environ.end();
  };
  EXPECT_TRUE(has(CycleEnviron(environment, config, 1, "", 0, "10.0.0.9"), "MASTER_ADDR=10.0.0.9"));
  EXPECT_TRUE(has(CycleEnviron(environment, config, 1, "", 0, std::nullopt), "MASTER_ADDR=10.0.0.1"));
  environment.variables["MASTER_ADDR"] = "trainer-0.svc";  // the user's own
  EXPECT_TRUE(has(CycleEnviron(environment, config, 1, "", 0, "10.0.0.9"), "MASTER_ADDR=trainer-0.svc"));
}

TEST(RestartPolicy, ACommitFromBeforeVersionsStaysUnversionedInTheDecision) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(storage::CommitRecord::Unversioned("job", "global_step7"));
  auto answer = MakeRestartPolicy(settings, committed)(FailureOf(0, 1));
  ASSERT_TRUE(answer.decision);
  auto commit = ResumeCommitOf(*answer.decision);
  ASSERT_TRUE(commit);
  EXPECT_EQ(commit->name, "global_step7");
  EXPECT_TRUE(commit->unversioned);
}

TEST(RestartPolicy, NothingCommittedResumesFromNothing) {
  env::RestartSettings settings;
  settings.max_restarts = 5;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(std::nullopt);
  auto answer = MakeRestartPolicy(settings, committed)(FailureOf(0, 1));
  ASSERT_TRUE(answer.decision);
  EXPECT_EQ((*answer.decision)["resume"], "");
  EXPECT_FALSE(ResumeCommitOf(*answer.decision));
}

TEST(RestartPolicy, ADecisionWhoseCommitIsNotARecordIsAnInternalError) {
  rendezvous::Message decision{{"resume", "x"}, {"commit", "{\"format\": \"something else\"}"}};
  try {
    ResumeCommitOf(decision);
    FAIL() << "no error";
  } catch (const LaunchFailure& failure) {
    EXPECT_EQ(failure.code(), kExitInternal);
    EXPECT_NE(std::string(failure.what()).find("the leader's restart decision"), std::string::npos) << failure.what();
  }
}

TEST(RestartPolicy, StopsAfterCyclesInARowWithoutANewCommittedCheckpoint) {
  env::RestartSettings settings;
  settings.max_restarts = 10;
  settings.max_cycles_without_progress = 2;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(Commit("checkpoint-1", {{0, "a"}}));
  auto policy = MakeRestartPolicy(settings, committed);
  EXPECT_TRUE(policy(FailureOf(0, 1)).decision);  // cycle 0 committed nothing new: 1 in a row
  committed->Committed(Commit("checkpoint-2", {{0, "b"}}));
  EXPECT_TRUE(policy(FailureOf(1, 1)).decision);  // progress: the count starts over
  EXPECT_TRUE(policy(FailureOf(2, 1)).decision);  // 1 in a row
  auto answer = policy(FailureOf(3, 1));          // 2 in a row
  EXPECT_FALSE(answer.decision);
  EXPECT_NE(answer.refusal.find("2 cycles in a row ended without a new committed checkpoint"), std::string::npos)
      << answer.refusal;
}

// A job that saves `state.pt` every cycle makes progress every cycle: each save is a new
// commit (new versions) under the same name.
TEST(RestartPolicy, ANameSavedAgainEachCycleIsProgress) {
  env::RestartSettings settings;
  settings.max_restarts = 10;
  settings.max_cycles_without_progress = 1;
  auto committed = std::make_shared<CommittedCheckpoints>();
  committed->Started(Commit("state.pt", {{0, "v1"}, {1, "w1"}}));
  auto policy = MakeRestartPolicy(settings, committed);
  for (int cycle = 0; cycle < 4; ++cycle) {
    committed->Committed(Commit("state.pt", {{0, "v" + std::to_string(cycle + 2)}, {1, "w" + std::to_string(cycle + 2)}}));
    auto answer = policy(FailureOf(cycle, 1));
    EXPECT_TRUE(answer.decision) << "cycle " << cycle << ": " << answer.refusal;
  }
  auto answer = policy(FailureOf(4, 1));  // nothing committed in cycle 4
  EXPECT_FALSE(answer.decision);
}

TEST(RenderCycles, TheDecisionsTimeIsInTheTimeline) {
  CycleRecord record;
  record.cycle = 1;
  record.cause = "node 1 failed";
  record.resume = "checkpoint-4";
  record.decided_in_s = 0.0123;
  record.every_job_stopped_s = 0.04;
  record.every_node_restarted_s = 0.05;
  record.restarts_used = 1;
  record.max_restarts = 3;
  const std::string text = RenderCycles({record});
  EXPECT_NE(text.find("fault → decided 12.3 ms → every job stopped 40.0 ms → every node restarted 50.0 ms"),
            std::string::npos) << text;
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
