// Several real bt-launch processes on loopback form one job.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

// One job of `nodes` launchers sharing a config, a root and a port.
class Job {
 public:
  // `rendezvous_extra` (", \"key\": value, ...") overrides the rendezvous defaults below.
  // With checkpointing, a node's drain waits for node 0's training to end.
  // `launcher_extra` is merged into the launcher object (restart settings, graces).
  Job(int nodes, const std::string& commands_json, const std::string& rendezvous_extra = "", bool checkpointing = true,
      const nlohmann::json& launcher_extra = nlohmann::json::object(), uint16_t port = FreePort())
      : nodes_(nodes), port_(port) {
    nlohmann::json rendezvous = {{"port", port_}, {"join_timeout_s", 20}, {"heartbeat_interval_s", 0.2},
                                 {"heartbeat_timeout_s", 3}, {"exit_barrier_timeout_s", 30}};
    if (!rendezvous_extra.empty()) rendezvous.update(nlohmann::json::parse("{" + rendezvous_extra.substr(1) + "}"));
    nlohmann::json config = {
        {"compute", {{"node_count", nodes}}},
        {"enable_baseten_workdir", false},
        {"runtime",
         {{"start_commands", nlohmann::json::parse(commands_json)},
          {"checkpointing_config", {{"enabled", checkpointing}}},
          {"cache_config", {{"enabled", true}}}}},
        {"launcher", {{"grace_period_s", 5}, {"rendezvous", rendezvous}}}};
    config["launcher"].update(launcher_extra);
    config_ = dir_.Write("job.json", config.dump());
  }

  LaunchSpec Spec(int rank, std::vector<std::string> extra_args = {}, std::map<std::string, std::string> env = {}) {
    LaunchSpec spec;
    spec.args = {"run", "--config", config_, "--root", dir_.path() + "/root"};
    spec.args.insert(spec.args.end(), extra_args.begin(), extra_args.end());
    spec.set_env = {{"BT_NODE_RANK", std::to_string(rank)}, {"BT_GROUP_SIZE", std::to_string(nodes_)},
                    {"BT_LEADER_ADDR", "127.0.0.1"}, {"BT_RENDEZVOUS_TOKEN", "integration-token"}};
    for (auto& [name, value] : env) spec.set_env[name] = value;
    spec.timeout = 60s;
    return spec;
  }

  std::vector<std::unique_ptr<LauncherProcess>> StartAll() {
    std::vector<std::unique_ptr<LauncherProcess>> processes;
    for (int rank = 0; rank < nodes_; ++rank) processes.push_back(std::make_unique<LauncherProcess>(Spec(rank)));
    return processes;
  }

  static std::vector<ProcessResult> FinishAll(std::vector<std::unique_ptr<LauncherProcess>>& processes) {
    std::vector<ProcessResult> results;
    for (auto& process : processes) results.push_back(process->Finish());
    return results;
  }

  // Merges `patch` into the job's config at its top level (weights[], runtime...).
  void Amend(const nlohmann::json& patch) {
    nlohmann::json config = nlohmann::json::parse(ReadFile(config_));
    config.merge_patch(patch);
    WriteFile(config_, config.dump());
  }

  const TempDir& dir() const { return dir_; }
  uint16_t port() const { return port_; }

 private:
  TempDir dir_;
  int nodes_;
  uint16_t port_;
  std::string config_;
};

// A start command whose training records its pid, so a test that kills the launcher can
// also kill the training it orphans.
constexpr const char* kLongTrainingRecordingItsPid =
    R"(["echo $$ > $BT_SCRATCH_DIR/../../training.pid; echo started; exec sleep 120"])";

// What a node crash or the OOM killer does to a node: its launcher dies by SIGKILL (and
// here, so that nothing outlives the test, its training too).
void KillNodeHard(Job& job, LauncherProcess& launcher, int rank) {
  launcher.Signal(SIGKILL);
  pid_t training = std::atoi(ReadFile(job.dir().path() + "/root/node-" + std::to_string(rank) + "/training.pid").c_str());
  if (training > 0) kill(training, SIGKILL);
}

class NodeCount : public ::testing::TestWithParam<int> {};

TEST_P(NodeCount, EveryNodeJoinsRunsAndExitsZero) {
  const int nodes = GetParam();
  Job job(nodes, R"(["echo node $BT_NODE_RANK of $BT_GROUP_SIZE master $MASTER_ADDR"])");
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < nodes; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("node " + std::to_string(rank) + " of " + std::to_string(nodes) + " master 127.0.0.1"),
              std::string::npos);
    EXPECT_NE(results[rank].err.find("all " + std::to_string(nodes) + " nodes joined"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(Loopback, NodeCount, ::testing::Values(2, 4, 16));

TEST(MultiNode, EarlyFinishersWaitAtTheExitBarrierForTheSlowest) {
  Job job(3, R"(["if [ $BT_NODE_RANK = 2 ]; then sleep 2; fi"])");
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << results[rank].err;
    EXPECT_GE(results[rank].elapsed, 1900ms) << "node " << rank << " left before node 2 finished";
  }
  EXPECT_NE(results[0].err.find("waiting for the other nodes to finish (exit barrier)"), std::string::npos);
}

TEST(MultiNode, ExitBarrierTimeoutNamesTheNodesStillRunning) {
  Job job(2, R"(["if [ $BT_NODE_RANK = 1 ]; then exec sleep 30; fi"])", R"(, "exit_barrier_timeout_s": 1)");
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[0].exit_code, 69);
  EXPECT_NE(results[0].err.find("exit barrier: nodes 1 have not finished after 1 s"), std::string::npos) << results[0].err;
  EXPECT_EQ(results[1].exit_code, 69) << "node 1 must stop when the leader leaves";
  EXPECT_NE(results[1].err.find("node 0 ("), std::string::npos) << results[1].err;
  EXPECT_NE(results[1].err.find("gave up: left the exit barrier after 1 s: nodes 1 have not finished"), std::string::npos)
      << results[1].err;
  EXPECT_LT(results[1].elapsed, 20s);
}

// The mirror image: a follower stops waiting. Its timeout is the job's result on every node,
// node 0 included: node 0's training is stopped and it exits 69 naming node 1, instead of
// finishing later with "every node succeeded" while node 1 exited 69.
TEST(MultiNode, FollowerWhoseExitBarrierTimesOutFailsTheJobOnEveryNode) {
  Job job(2, R"(["if [ $BT_NODE_RANK = 0 ]; then exec sleep 30; fi"])", R"(, "exit_barrier_timeout_s": 1)", false);
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 69) << results[1].err;
  EXPECT_NE(results[1].err.find("exit barrier: the other nodes have not finished after 1 s; ending the job as failed"),
            std::string::npos) << results[1].err;
  EXPECT_EQ(results[0].exit_code, results[1].exit_code) << "the nodes disagree about the job's result:\n" << results[0].err;
  EXPECT_NE(results[0].err.find("node 1 ("), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("gave up: left the exit barrier after 1 s"), std::string::npos) << results[0].err;
  EXPECT_LT(results[0].elapsed, 20s) << "node 0's training ran on after the job had failed";
}

// Every node exits with the failed training's code, so that a scheduler reading the highest
// task code (srun) or every pod's sees 3, not 69; the log names the node it came from.
TEST(MultiNode, FailedNodeStopsEveryoneWhoExitWithItsCodeAndNameIt) {
  Job job(3, R"(["if [ $BT_NODE_RANK = 1 ]; then sleep 0.3; exit 3; fi; exec sleep 60"])");
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 3) << results[1].err;
  for (int rank : {0, 2}) {
    EXPECT_EQ(results[rank].exit_code, 3) << results[rank].err;
    EXPECT_NE(results[rank].err.find("exiting with node 1's exit code 3"), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("job failed: node 1 ("), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("failed: exit code 3"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 20s);
  }
}

// srun --kill-on-bad-exit SIGTERMs every task once one fails: a survivor whose training
// is still stopping (it saves on SIGTERM) when that SIGTERM comes still exits with the
// failed node's code, which is what the scheduler then shows.
TEST(MultiNode, ASigtermWhileAPeerFailureStopsTheJobKeepsTheFailedNodesCode) {
  Job job(2, R"(["if [ $BT_NODE_RANK = 1 ]; then sleep 0.5; exit 3; fi; trap 'sleep 1; exit 143' TERM; sleep 60 & wait"])");
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForLog("stopping the job: node 1", 20s));
  processes[0]->Signal(SIGTERM);
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 3) << results[1].err;
  EXPECT_EQ(results[0].exit_code, 3) << results[0].err;
  EXPECT_NE(results[0].err.find("exiting with node 1's exit code 3"), std::string::npos) << results[0].err;
}

TEST(MultiNode, TrainingKilledBySigkillStopsTheWholeJobWithin15Seconds) {
  Job job(3, R"(["if [ $BT_NODE_RANK = 2 ]; then sleep 0.5; kill -KILL $$; fi; exec sleep 120"])");
  auto started = std::chrono::steady_clock::now();
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 15s);
  EXPECT_EQ(results[2].exit_code, 137);
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].exit_code, 137) << results[rank].err;
    EXPECT_NE(results[rank].err.find("killed by signal KILL"), std::string::npos) << results[rank].err;
  }
}

TEST(MultiNode, AJobsOwnExitCodeAbove128IsNotReportedAsASignal) {
  Job job(2, R"(["if [ $BT_NODE_RANK = 1 ]; then sleep 0.5; exit 130; fi; exec sleep 120"])");
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 130);
  EXPECT_EQ(results[0].err.find("killed by signal"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("exit code 130"), std::string::npos) << results[0].err;
}

TEST(MultiNode, KilledLauncherIsReportedLost) {
  Job job(3, kLongTrainingRecordingItsPid);
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 20s));
  std::this_thread::sleep_for(300ms);
  KillNodeHard(job, *processes[1], 1);
  auto results = Job::FinishAll(processes);
  for (int rank : {0, 2}) {
    EXPECT_EQ(results[rank].exit_code, 69) << results[rank].err;
    EXPECT_NE(results[rank].err.find("node 1 ("), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("lost: connection closed"), std::string::npos) << results[rank].err;
  }
}

TEST(MultiNode, KilledLeaderIsReportedByEveryFollower) {
  Job job(3, kLongTrainingRecordingItsPid);
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 20s));
  ASSERT_TRUE(processes[2]->WaitForOutput("started", 20s));
  KillNodeHard(job, *processes[0], 0);
  auto results = Job::FinishAll(processes);
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].exit_code, 69) << results[rank].err;
    EXPECT_NE(results[rank].err.find("leader (node 0) lost"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 20s);
  }
}

// CPU seconds (user + system) a process has used, from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(stat.substr(close + 2));
  std::string field;
  unsigned long long user = 0, system = 0;
  for (int index = 3; fields >> field; ++index) {
    if (index == 14) user = std::stoull(field);
    if (index == 15) {
      system = std::stoull(field);
      break;
    }
  }
  return double(user + system) / double(sysconf(_SC_CLK_TCK));
}

TEST(MultiNode, PeerFailureStopsEveryNodeWithin15sWhateverTheTrainingDoesWithSigterm) {
  // Node 0's training fails after a second; node 1's ignores SIGTERM (the default grace is
  // 30 s): the peer-failure grace (5 s) applies, and node 0 keeps serving until node 1 has
  // reported.
  Job job(2, R"(["if [ $BT_NODE_RANK = 0 ]; then echo started; sleep 1; exit 3; else trap '' TERM; echo started; sleep 60 & wait; sleep 60; fi"])");
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 20s));
  auto failed_at = std::chrono::steady_clock::now();
  auto results = Job::FinishAll(processes);
  EXPECT_LT(std::chrono::steady_clock::now() - failed_at, 15s);
  EXPECT_EQ(results[0].exit_code, 3) << results[0].err;
  EXPECT_EQ(results[1].exit_code, 3) << results[1].err;
  EXPECT_NE(results[1].err.find("has 5000 ms to exit before SIGKILL"), std::string::npos) << results[1].err;
  for (const auto& result : results) {
    EXPECT_NE(result.err.find("exit code 3"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("cannot report this node's result"), std::string::npos) << result.err;
  }
}

TEST(MultiNode, FollowerInItsGraceAfterTheLeaderIsGoneDoesNotSpin) {
  // The follower's training ignores SIGTERM, so it stays in its grace period (5 s) after
  // the leader disappears: the launcher must sleep through it, not poll a dead connection.
  Job job(2, R"(["echo $$ > $BT_SCRATCH_DIR/../../training.pid; trap '' TERM; echo started; sleep 60 & wait; sleep 60"])");
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 20s));
  KillNodeHard(job, *processes[0], 0);
  ASSERT_TRUE(processes[1]->WaitForLog("stopping the job", 20s));
  const double before = CpuSeconds(processes[1]->pid());
  std::this_thread::sleep_for(3s);
  const double spent = CpuSeconds(processes[1]->pid()) - before;
  EXPECT_LT(spent, 0.5) << "the follower used " << spent << " s of CPU in 3 s of its grace period";
  ProcessResult follower = processes[1]->Finish();
  EXPECT_EQ(follower.exit_code, 69) << follower.err;
  kill(-std::atoi(ReadFile(job.dir().path() + "/root/node-1/training.pid").c_str()), SIGKILL);
}

TEST(MultiNode, ChildrenExitingDuringTheExitBarrierAreReaped) {
  // Node 0 finishes at once, leaving a process that escaped its group and exits while node
  // 0 waits at the exit barrier for node 1.
  Job job(2, R"(["if [ $BT_NODE_RANK = 0 ]; then setsid sleep 1 & true; else sleep 5; fi"])");
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForLog("waiting for the other nodes to finish", 20s));
  std::this_thread::sleep_for(2500ms);
  EXPECT_TRUE(ZombieChildrenOf(processes[0]->pid()).empty()) << "a zombie waits for the launcher to exit";
  for (auto& result : Job::FinishAll(processes)) EXPECT_EQ(result.exit_code, 0) << result.err;
}

TEST(MultiNode, LeaderOutOfDescriptorsNeitherSpinsNorLocksOutARealNode) {
  // The leader may open 64 files; 100 connections that never authenticate arrive first.
  TempDir dir;
  const uint16_t port = FreePort();
  std::map<std::string, std::string> env = {{"BT_RENDEZVOUS_PORT", std::to_string(port)},
                                            {"BT_RENDEZVOUS_TOKEN", "descriptor-test"}};
  LaunchSpec leader_spec{{"--nofile=64:64", BT_LAUNCH_BINARY, "rendezvous", "--serve", "--node-count", "2",
                          "--leader-addr", "127.0.0.1", "--root",
                          dir.path() + "/root"}, env};
  LauncherProcess leader(leader_spec, "/usr/bin/prlimit");
  ASSERT_TRUE(leader.WaitForLog("serving the rendezvous", 10s));
  std::vector<int> idle;
  for (int i = 0; i < 100; ++i) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(500ms);
  const double before = CpuSeconds(leader.pid());
  std::this_thread::sleep_for(2s);
  EXPECT_LT(CpuSeconds(leader.pid()) - before, 0.5) << "the leader spins at EMFILE";
  LaunchSpec follower_spec{{"rendezvous", "--node-rank", "1", "--node-count", "2", "--leader-addr", "127.0.0.1", "--root",
                            dir.path() + "/root"}, env};
  ProcessResult follower = RunLauncher(follower_spec);
  ProcessResult served = leader.Finish();
  for (int fd : idle) close(fd);
  EXPECT_EQ(follower.exit_code, 0) << follower.err;
  EXPECT_EQ(served.exit_code, 0) << served.err;
  EXPECT_NE(served.err.find("rendezvous: closed a connection from 127.0.0.1"), std::string::npos) << served.err;
}

TEST(MultiNode, MissingNodesAreNamedByLeaderAndFollowers) {
  Job job(4, R"(["true"])", R"(, "join_timeout_s": 2)");
  LauncherProcess leader(job.Spec(0)), follower(job.Spec(2));
  ProcessResult leader_result = leader.Finish(), follower_result = follower.Finish();
  for (const ProcessResult* result : {&leader_result, &follower_result}) {
    EXPECT_EQ(result->exit_code, 69) << result->err;
    EXPECT_NE(result->err.find("2 of 4 nodes missing after 2 s: ranks 1, 3; joined: 0 "), std::string::npos) << result->err;
  }
}

TEST(MultiNode, WrongTokenIsRejected) {
  Job job(2, R"(["true"])", R"(, "join_timeout_s": 3)");
  LauncherProcess leader(job.Spec(0));
  LauncherProcess intruder(job.Spec(1, {}, {{"BT_RENDEZVOUS_TOKEN", "some-other-token"}}));
  ProcessResult intruder_result = intruder.Finish();
  EXPECT_EQ(intruder_result.exit_code, 69);
  EXPECT_NE(intruder_result.err.find("wrong job token"), std::string::npos) << intruder_result.err;
  ProcessResult leader_result = leader.Finish();
  EXPECT_EQ(leader_result.exit_code, 69);
  EXPECT_NE(leader_result.err.find("ranks 1"), std::string::npos) << leader_result.err;
}

TEST(MultiNode, TwoNodesClaimingOneRankAreBothTold) {
  Job job(3, R"(["sleep 5"])");
  LauncherProcess leader(job.Spec(0)), first(job.Spec(1));
  // The first claim must reach the leader before the second; a loopback join takes
  // milliseconds, and either order would fail both nodes the same way.
  std::this_thread::sleep_for(700ms);
  LauncherProcess second(job.Spec(1));
  for (LauncherProcess* process : {&first, &second, &leader}) {
    ProcessResult result = process->Finish();
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_NE(result.err.find("rank 1 claimed by two nodes"), std::string::npos) << result.err;
  }
}

TEST(MultiNode, LoopbackLeaderWithoutALeaderIsExplained) {
  Job job(2, R"(["true"])", R"(, "join_timeout_s": 1)");
  ProcessResult result = RunLauncher(job.Spec(1));
  EXPECT_EQ(result.exit_code, 69);
  EXPECT_NE(result.err.find("never answered"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("is a loopback address"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("`bt-launch doctor` on this node"), std::string::npos) << result.err;
}

TEST(MultiNode, SigtermWhileWaitingForTheLeaderExits143) {
  Job job(2, R"(["true"])");
  LauncherProcess follower(job.Spec(1));
  ASSERT_TRUE(follower.WaitForLog("waiting for the leader at", 20s)) << follower.Finish().err;  // in its retries
  follower.Signal(SIGTERM);
  ProcessResult result = follower.Finish();
  EXPECT_EQ(result.exit_code, 128 + SIGTERM) << result.err;
  EXPECT_NE(result.err.find("while waiting for the leader"), std::string::npos) << result.err;
}

TEST(MultiNode, NodesSharingARootKeepNodeLocalDirsApartAndShareTheCache) {
  Job job(2, R"(["echo $BT_NODE_RANK > $BT_CHECKPOINT_DIR/rank && echo $BT_NODE_RANK > $BT_PROJECT_CACHE_DIR/from-$BT_NODE_RANK"])");
  auto processes = job.StartAll();
  for (auto& result : Job::FinishAll(processes)) ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string root = job.dir().path() + "/root";
  for (int rank : {0, 1}) {
    EXPECT_EQ(ReadFile(root + "/node-" + std::to_string(rank) + "/mnt/ckpts/rank"), std::to_string(rank) + "\n");
  }
  EXPECT_TRUE(fs::exists(root + "/root/.cache/user_artifacts/from-0"));
  EXPECT_TRUE(fs::exists(root + "/root/.cache/user_artifacts/from-1"));
}

TEST(MultiNode, RendezvousSubcommandPrintsTheRoster) {
  Job job(3, R"(["true"])");
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 3; ++rank) {
    LaunchSpec spec = job.Spec(rank);
    spec.args[0] = "rendezvous";
    spec.args.insert(spec.args.end(), {"--format", "json"});
    if (rank == 0) {
      spec.args.push_back("--serve");
      spec.set_env.erase("BT_NODE_RANK");
    }
    processes.push_back(std::make_unique<LauncherProcess>(spec));
  }
  for (auto& result : Job::FinishAll(processes)) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    auto roster = nlohmann::json::parse(result.out);
    EXPECT_EQ(roster["node_count"], 3);
    ASSERT_EQ(roster["nodes"].size(), 3u);
    for (int rank = 0; rank < 3; ++rank) {
      EXPECT_EQ(roster["nodes"][rank]["rank"], rank);
      EXPECT_EQ(roster["nodes"][rank]["seen_from"], "127.0.0.1");
    }
  }
}

TEST(MultiNode, TableRosterForHumans) {
  Job job(2, R"(["true"])");
  LaunchSpec leader_spec = job.Spec(0), follower_spec = job.Spec(1);
  leader_spec.args[0] = follower_spec.args[0] = "rendezvous";
  LauncherProcess leader(leader_spec), follower(follower_spec);
  ProcessResult result = leader.Finish();
  follower.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("rank  host"), std::string::npos) << result.out;
  EXPECT_NE(result.out.find("joined after"), std::string::npos);
}


namespace restart {

constexpr const char* kJobId = "restart-job";

// A job whose launchers restart in place, checkpointing into `dir/remote`.
nlohmann::json RestartSettings(const TempDir& dir, int max_restarts, double peer_grace_s = 5) {
  return {{"job_id", kJobId},
          {"peer_failure_grace_s", peer_grace_s},
          {"restart", {{"max_restarts", max_restarts}, {"rejoin_timeout_s", 60}}},
          {"checkpoint",
           {{"destination", "file://" + dir.path() + "/remote"}, {"scan_interval_s", 0.5}, {"quiet_period_s", 2},
            {"drain_timeout_s", 10}}}};
}

// Saves checkpoint-N in the Trainer's order (trainer_state.json completes it).
std::string Save(int step) {
  const std::string dir = "$BT_CHECKPOINT_DIR/checkpoint-" + std::to_string(step);
  return "mkdir -p " + dir + " && head -c 100000 /dev/urandom > " + dir + "/model.bin && echo '{}' > " + dir +
         "/config.json && echo '{\"global_step\": " +
         std::to_string(step) + "}' > " + dir + "/trainer_state.json";
}

// Blocks the job until `path` exists (a commit, an uploaded part), at most 30 s.
std::string WaitFor(const std::string& path) {
  return "for i in $(seq 300); do [ -s " + path + " ] && break; sleep 0.1; done";
}

// What a cycle after the first prints: its count, the checkpoint it resumes from and the step in it.
constexpr const char* kReportResume =
    "echo \"cycle $BT_RESTART_COUNT torchelastic $TORCHELASTIC_RESTART_COUNT resume $BT_RESUME_CHECKPOINT "
    "$(cat $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK/$BT_RESUME_CHECKPOINT/trainer_state.json) "
    "$(ls $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK | tr '\\n' ' ')\"";

// The line kReportResume prints for a node of `cycle` resumed from checkpoint-<step>.
std::string ResumeReport(int cycle, int step) {
  const std::string checkpoint = "checkpoint-" + std::to_string(step);
  return "cycle " + std::to_string(cycle) + " torchelastic " + std::to_string(cycle) + " resume " + checkpoint +
         " {\"global_step\": " + std::to_string(step) + "} " + checkpoint + " \n";
}

std::string Commands(const std::string& cycle0, const std::string& later) {
  return nlohmann::json::array({"if [ \"$BT_RESTART_COUNT\" = 0 ]; then " + cycle0 + "; else " + later + "; fi"}).dump();
}

TEST(Restart, FailureOnNode2RestartsEveryNodeWithTheSameCountFromTheCommittedStep) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string cycle0 = Save(4) + " && " + WaitFor(latest) + " && if [ $BT_NODE_RANK = 2 ]; then exit 1; fi; exec sleep 60";
  Job job(3, Commands(cycle0, kReportResume), "", true, RestartSettings(scratch, 2), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find(ResumeReport(1, 4)),
              std::string::npos) << "node " << rank << ":\n" << results[rank].out << results[rank].err;
    EXPECT_NE(results[rank].err.find("restarts: cycle 1 (node 2 ("), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("resumed from checkpoint-4, restarts 1/2"), std::string::npos) << results[rank].err;
    // The leader's figures of the restart, from its decision, the same on every node.
    EXPECT_NE(results[rank].err.find("): fault → decided "), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find(" → every job stopped "), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find(" → every node restarted "), std::string::npos) << results[rank].err;
    // The node wrote checkpoint-4 itself: linked from its own disk, not downloaded.
    EXPECT_NE(results[rank].err.find("linked from this node's own copy"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 50s);
  }
}

TEST(Restart, BudgetIsGlobalAndTheJobFailsAtFailureMaxRestartsPlusOne) {
  TempDir scratch;
  // Cycle c fails on node c: three different nodes, three failures.
  Job job(3, R"(["if [ $BT_RESTART_COUNT = $BT_NODE_RANK ]; then sleep 0.3; exit 3; fi; exec sleep 60"])", "", false,
          RestartSettings(scratch, 2), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 3) << "node " << rank << ":\n" << results[rank].err;
    const std::string& log = results[rank].err;
    EXPECT_NE(log.find("cycle 1 (node 0 ("), std::string::npos) << log;
    EXPECT_NE(log.find("cycle 2 (node 1 ("), std::string::npos) << log;
    EXPECT_NE(log.find("restarts 2/2"), std::string::npos) << log;
    EXPECT_EQ(log.find("every node is ready: running cycle 3"), std::string::npos) << log;
  }
  // The third failure, and why it ends the job, as every other node was told.
  for (int rank : {0, 1}) {
    EXPECT_NE(results[rank].err.find("job failed: node 2 ("), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("failed: exit code 3; no restart left (2/2 used, launcher.restart.max_restarts)"),
              std::string::npos) << results[rank].err;
  }
}

TEST(Restart, FaultWhileACheckpointIsIncompleteResumesFromThePreviousCommittedOne) {
  TempDir scratch;
  const std::string remote = scratch.path() + "/remote/" + kJobId;
  // checkpoint-1 is committed everywhere; checkpoint-2 is uploaded by nodes 0 and 1 only
  // when node 2 fails, so `latest` never moved to it. Node 2's part of it is being written
  // all along (it could otherwise answer "no part" while node 1's upload is slow).
  const std::string cycle0 = Save(1) + " && " + WaitFor(remote + "/latest") +
                             " && if [ $BT_NODE_RANK = 2 ]; then mkdir -p $BT_CHECKPOINT_DIR/checkpoint-2; "
                             "(while true; do echo x >> $BT_CHECKPOINT_DIR/checkpoint-2/model.bin; sleep 0.1; done) & " +
                             WaitFor(remote + "/rank-1/.bt-versions/*/checkpoint-2.bt-manifest.json") +
                             "; exit 1; fi; " + Save(2) + "; exec sleep 60";
  // Cycle 1 drops the uncommitted checkpoint-2 (node 2 never has it), as a training that
  // resumed from checkpoint-1 would overwrite it: the drain then has nothing left to commit.
  Job job(3, Commands(cycle0, std::string("rm -rf $BT_CHECKPOINT_DIR/checkpoint-2; ") + kReportResume), "", true,
          RestartSettings(scratch, 1), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find(ResumeReport(1, 1)),
              std::string::npos) << "node " << rank << ":\n" << results[rank].out << results[rank].err;
  }
}

// Node 1's training ignores SIGTERM, so the restart's stop lasts the peer grace (3 s):
// the window in which the tests below hit the job. Node 2 fails once node 1 ignores it (a
// file in the shared root: a fixed wait lost that race to a slow start on a busy machine).
constexpr const char* kSlowToStop =
    R"(["trapped=$BT_SCRATCH_DIR/../../../node-1-traps-term; if [ $BT_NODE_RANK = 2 ]; then for i in $(seq 300); do [ -e $trapped ] && break; sleep 0.05; done; exit 1; fi; if [ $BT_NODE_RANK = 1 ]; then trap '' TERM; touch $trapped; fi; echo started; sleep 60"])";

// The job's launchers once node 0 has pushed cycle 1 (node 1 still stopping); empty when it never did.
std::vector<std::unique_ptr<LauncherProcess>> StartAndEnterTheRestart(Job& job) {
  auto processes = job.StartAll();
  if (processes[0]->WaitForLog("restarting every node in cycle 1", 30s)) return processes;
  Job::FinishAll(processes);
  return {};
}

// Node 2's launcher is lost while node 1 is still stopping for cycle 1: cycle 1 has not run,
// so the loss spends no second restart (review finding F5): the leader waits, in cycle 1, for
// a launcher to take rank 2 again. None comes: at launcher.restart.rejoin_timeout_s every
// node ends, naming node 2.
TEST(Restart, ALauncherLostDuringTheRestartThatNeverRejoinsEndsTheJobAtTheRejoinTimeout) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 3, 3);
  settings["restart"]["rejoin_timeout_s"] = 4;
  Job job(3, kSlowToStop, "", false, settings, FreePort());
  auto processes = StartAndEnterTheRestart(job);
  ASSERT_FALSE(processes.empty());
  processes[2]->Signal(SIGKILL);
  auto results = Job::FinishAll(processes);
  for (int rank : {0, 1}) {
    EXPECT_EQ(results[rank].exit_code, 69) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_EQ(results[rank].err.find("cycle 2"), std::string::npos) << "a second restart was spent:\n" << results[rank].err;
    EXPECT_NE(results[rank].err.find("cycle 1 did not start: node 2 ("), std::string::npos) << results[rank].err;
    EXPECT_NE(results[rank].err.find("lost: its launcher has not joined again) not ready within 4 s "
                                     "(launcher.restart.rejoin_timeout_s)"),
              std::string::npos) << results[rank].err;
    EXPECT_EQ(results[rank].err.find("every node is ready: running cycle"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 40s);
  }
  EXPECT_NE(results[0].err.find("while cycle 1 waits to start: its rank is awaited again (no restart spent)"),
            std::string::npos) << results[0].err;
}

// Node 0 saved checkpoint-1; node 1's launcher is lost before it answered and never comes
// back. The job ends at the rejoin timeout (69). Only the launcher that ran rank 1 could
// answer for its part, so node 0 abandons the save at once instead of holding its drain
// (and the job's end) for drain_timeout_s, and the job keeps the loss's code, 69, on
// node 0 too (soak seed 6: node 0 waited out the drain and exited 74 beside the others' 69).
TEST(Restart, ASaveLeftOpenByALostNodeIsAbandonedAndTheJobEnds69) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 2, 3);
  settings["restart"]["rejoin_timeout_s"] = 3;
  settings["checkpoint"]["drain_timeout_s"] = 120;
  const std::string commands = nlohmann::json::array(
      {"if [ $BT_NODE_RANK = 0 ] && [ $BT_RESTART_COUNT = 0 ]; then " + Save(1) + "; fi; exec sleep 60"}).dump();
  Job job(2, commands, "", true, settings, FreePort());
  auto processes = job.StartAll();
  // Node 0 declared it; node 1 answers "no part" only after 2 s without it: kill it before.
  ASSERT_TRUE(processes[0]->WaitForLog("checkpoint-1 is complete", 30s)) << processes[0]->Finish().err;
  processes[1]->Signal(SIGKILL);  // its guard stops its training
  processes[1]->Finish();
  const ProcessResult leader = processes[0]->Finish();
  EXPECT_EQ(leader.exit_code, 69) << leader.err;
  EXPECT_LT(leader.elapsed, 60s) << "node 0 waited out drain_timeout_s for a part that could never come";
  EXPECT_NE(leader.err.find("not ready within 3 s (launcher.restart.rejoin_timeout_s)"), std::string::npos) << leader.err;
  EXPECT_NE(leader.err.find("the save of checkpoint-1 (cycle 0) is not committed: the launcher of node(s) 1 is gone and "
                            "had not answered"),
            std::string::npos) << leader.err;
}

// Soak seeds 21 and 91: node 1's launcher is lost while node 0's checkpoint-1 waits for its
// answer (abandoned at once), node 0 decides a restart, and the orchestrator SIGTERMs the job
// while the barrier waits for node 1. The restart's decision sealed that save: node 0 exits
// 143 as the follower does, not 74 for a "lost" last checkpoint.
TEST(Restart, ASigtermWhileARestartWaitsDoesNotCountItsSealedSavesAsLost) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 2, 3);
  const std::string commands = nlohmann::json::array(
      {"if [ $BT_NODE_RANK = 0 ] && [ $BT_RESTART_COUNT = 0 ]; then " + Save(1) + "; fi; exec sleep 60"}).dump();
  Job job(3, commands, "", true, settings, FreePort());
  auto processes = job.StartAll();
  // Node 0 declared it; node 1 answers "no part" only after 2 s without it: kill it before.
  ASSERT_TRUE(processes[0]->WaitForLog("checkpoint-1 is complete", 30s)) << processes[0]->Finish().err;
  processes[1]->Signal(SIGKILL);  // its guard stops its training; nobody replaces it
  processes[1]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("restart: cycle 1: waiting", 30s)) << processes[0]->Finish().err;
  for (int rank : {0, 2}) processes[rank]->Signal(SIGTERM);
  const ProcessResult leader = processes[0]->Finish();
  const ProcessResult follower = processes[2]->Finish();
  EXPECT_NE(leader.err.find("the save of checkpoint-1 (cycle 0) is not committed"), std::string::npos) << leader.err;
  EXPECT_EQ(leader.exit_code, 143) << leader.err;
  EXPECT_EQ(follower.exit_code, 143) << follower.err;
}

// Review 6, R6-4: as above, but node 2's part of the sealed save is still uploading (its
// uploader frozen): both drains waited drain_timeout_s for a save no commit could take, and
// exited 74. The decision sealed it: the job ends at once, 143 on both.
TEST(Restart, ASigtermWhileARestartWaitsDoesNotWaitForASealedSavesUpload) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 2, 3);
  settings["checkpoint"]["drain_timeout_s"] = 30;
  const std::string commands = nlohmann::json::array(
      {"if [ $BT_RESTART_COUNT = 0 ]; then if [ $BT_NODE_RANK = 2 ]; then pkill -STOP -P $PPID -f 'upload-worke[r]'; fi; "
       "if [ $BT_NODE_RANK != 1 ]; then " + Save(1) + "; fi; fi; echo saved; exec sleep 60"}).dump();
  Job job(3, commands, "", true, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForLog("checkpoints: uploaded checkpoint-1", 30s)) << processes[0]->Finish().err;
  ASSERT_TRUE(processes[2]->WaitForLog("checkpoint-1 is complete", 30s)) << processes[2]->Finish().err;
  processes[1]->Signal(SIGKILL);  // nobody replaces it
  processes[1]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("restart: cycle 1: waiting", 30s)) << processes[0]->Finish().err;
  const auto signalled = std::chrono::steady_clock::now();
  for (int rank : {0, 2}) processes[rank]->Signal(SIGTERM);
  const ProcessResult leader = processes[0]->Finish();
  const ProcessResult follower = processes[2]->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 15s) << leader.err << follower.err;
  EXPECT_EQ(leader.exit_code, 143) << leader.err;
  EXPECT_EQ(follower.exit_code, 143) << follower.err;
  EXPECT_EQ(ReadFile(scratch.path() + "/remote/" + kJobId + "/latest").find("checkpoint-1"), std::string::npos);
}

// Node 2's launcher is lost while node 0 still seeds the cache: the job never ran, so the
// loss ends it (69, naming node 2) instead of spending a restart on a cycle that never ran.
TEST(Restart, ALauncherLostBeforeTheRunEndsTheJobWithoutARestart) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 1, 3);
  settings["cache"] = {{"seed_commands", nlohmann::json::array({"sleep 3"})}};
  Job job(3, R"(["echo ran"])", "", false, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[2]->WaitForLog("cache seed: waiting for node 0", 20s));
  processes[2]->Signal(SIGKILL);
  processes[2]->Finish();
  for (int rank : {0, 1}) {
    const ProcessResult result = processes[rank]->Finish();
    EXPECT_EQ(result.exit_code, 69) << "node " << rank << ":\n" << result.err;
    EXPECT_NE(result.err.find("lost: connection closed"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("restarting every node"), std::string::npos) << result.err;
    EXPECT_EQ(result.out.find("ran"), std::string::npos) << result.out << result.err;
  }
  // The seed was stopped: nothing says it is done, or the next job would skip it.
  const std::string seeds = job.dir().path() + "/root/root/.cache/user_artifacts/.bt-seed";
  if (std::filesystem::is_directory(seeds)) {
    for (const auto& entry : std::filesystem::directory_iterator(seeds)) {
      EXPECT_NE(entry.path().extension(), ".done") << entry.path();
    }
  }
}

// A node's launcher is SIGKILLed (its job dies with it). The others stop theirs, and the
// leader waits for rank 2, saying every 10 s on every node that it does. A new launcher
// with rank 2 joins, and all three run cycle 1. A launcher that then claims rank 2 (a
// copy of the old one coming back) is refused, named by the leader, and changes nothing.
TEST(Restart, AReplacedLauncherRejoinsAndALateOneIsRefused) {
  TempDir scratch;
  const std::string go = scratch.path() + "/go";
  const std::string commands = nlohmann::json::array(
      {"echo \"cycle $BT_RESTART_COUNT node $BT_NODE_RANK\"; if [ \"$BT_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi; " +
       std::string("while [ ! -e ") + go + " ]; do sleep 0.1; done"}).dump();
  nlohmann::json settings = RestartSettings(scratch, 1, 3);
  settings["restart"]["rejoin_timeout_s"] = 40;
  Job job(3, commands, "", false, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[2]->WaitForOutput("cycle 0 node 2", 20s));
  // Node 0 marks the run started as its own commands start: a loss before that is a failed
  // start (it failed so once, 88 ms in, on a loaded machine).
  ASSERT_TRUE(processes[0]->WaitForOutput("cycle 0 node 0", 20s));
  processes[2]->Signal(SIGKILL);
  const ProcessResult killed = processes[2]->Finish();
  ASSERT_TRUE(processes[1]->WaitForLog("lost: its launcher has not joined again)", 30s))
      << "no node heard that node 2 is awaited";
  EXPECT_TRUE(processes[1]->WaitForLog("restart: cycle 1: waiting 10 s for node 2 (", 1s));
  processes[2] = std::make_unique<LauncherProcess>(job.Spec(2));
  for (auto& process : processes) ASSERT_TRUE(process->WaitForOutput("cycle 1 node", 20s));
  LauncherProcess late(job.Spec(2));
  const ProcessResult refused = late.Finish();
  EXPECT_EQ(refused.exit_code, 69) << refused.err;
  EXPECT_NE(refused.err.find("the rendezvous is already closed: rank 2 is held by"), std::string::npos) << refused.err;
  WriteFile(go);
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("cycle 1 node " + std::to_string(rank)), std::string::npos) << results[rank].out;
  }
  EXPECT_EQ(results[2].out.find("cycle 0"), std::string::npos) << "the new launcher ran cycle 0: " << results[2].out;
  EXPECT_NE(results[2].err.find("this launcher replaces a lost one: it meets the other nodes in cycle 1"),
            std::string::npos) << results[2].err;
  EXPECT_NE(results[0].err.find(", 127.0.0.1) lost: connection closed"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("joined again from 127.0.0.1"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("refused a join from node 2"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("restarts 1/1"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("(but lost node 2's, whose stop is not known) → every node restarted"), std::string::npos)
      << results[0].err;
}

TEST(Restart, SigtermDuringTheRestartStopsEveryNodeWithoutRestarting) {
  TempDir scratch;
  Job job(3, kSlowToStop, "", false, RestartSettings(scratch, 3, 3), FreePort());
  auto processes = StartAndEnterTheRestart(job);
  ASSERT_FALSE(processes.empty());
  for (auto& process : processes) process->Signal(SIGTERM);
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    // 128+TERM; or KILL for node 1, whose training ignores TERM through the grace; or, for
    // node 2, its training's own code when the TERM came before the leader's answer.
    const int code = results[rank].exit_code;
    EXPECT_TRUE(code == 143 || (rank == 1 && code == 137) || (rank == 2 && code == 1))
        << "node " << rank << " exit " << results[rank].exit_code << ":\n" << results[rank].err;
    EXPECT_EQ(results[rank].err.find("every node is ready: running cycle 1"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 40s);
  }
}

TEST(Restart, KilledLeaderEndsTheJobOnEveryFollowerWith69) {
  TempDir scratch;
  Job job(3, kLongTrainingRecordingItsPid, "", false, RestartSettings(scratch, 3), FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 20s));
  ASSERT_TRUE(processes[2]->WaitForOutput("started", 20s));
  KillNodeHard(job, *processes[0], 0);
  auto results = Job::FinishAll(processes);
  for (int rank : {1, 2}) {
    EXPECT_EQ(results[rank].exit_code, 69) << results[rank].err;
    EXPECT_NE(results[rank].err.find("leader (node 0) lost"), std::string::npos) << results[rank].err;
    EXPECT_LT(results[rank].elapsed, 20s);  // heartbeat_timeout_s 3 + peer grace 5, with slack for a loaded machine
  }
}

TEST(Restart, CyclesInARowWithoutANewCommittedCheckpointStopTheRestarts) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 5);
  settings["restart"]["max_cycles_without_progress"] = 2;
  Job job(2, R"(["if [ $BT_NODE_RANK = 1 ]; then sleep 0.3; exit 4; fi; exec sleep 60"])", "", true, settings,
          FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[0].exit_code, 4) << results[0].err;
  EXPECT_EQ(results[1].exit_code, 4) << results[1].err;
  EXPECT_NE(results[0].err.find("not restarting: 2 cycles in a row ended without a new committed checkpoint "
                                "(launcher.restart.max_cycles_without_progress; 1/5 restarts used)"),
            std::string::npos) << results[0].err;
  EXPECT_EQ(results[0].err.find("every node is ready: running cycle 2"), std::string::npos) << results[0].err;
}

size_t CommitRecordsIn(const std::string& directory) {
  size_t count = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(directory)) ++count;
  return count;
}

// The first run commits checkpoint-3, then both nodes write step-4 (the generic layout: its
// marker last) and every launcher is SIGKILLed just as the markers appear, before any
// launcher saw the save complete: nothing journaled. The retried run resumes from
// checkpoint-3 and must not commit the last run's step-4 left on disk: `latest` would pass
// what the training resumed from, and an old part would answer a new save of its name
// (soak seeds 17, 21, 73).
TEST(Restart, ARetriedJobNeverCommitsTheLastRunsSavesLeftOnDisk) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string written = scratch.path() + "/written-";
  const std::string commands = nlohmann::json::array(
      {"if [ -n \"$BT_RESUME_CHECKPOINT\" ]; then echo \"resumed $BT_RESUME_CHECKPOINT\"; sleep 4; else " + Save(3) +
       " && " + WaitFor(latest) + " && mkdir -p $BT_CHECKPOINT_DIR/step-4 && head -c 50000 /dev/urandom > "
       "$BT_CHECKPOINT_DIR/step-4/payload.bin && echo $BT_CHECKPOINT_DIR > " + written + "$BT_NODE_RANK && exec sleep 60; fi"})
                                   .dump();
  nlohmann::json settings = RestartSettings(scratch, 0);
  settings["checkpoint"]["quiet_period_s"] = 60;  // step-4 completes by its marker only
  Job job(2, commands, "", true, settings, FreePort());
  {
    auto first = job.StartAll();
    for (int rank = 0; rank < 2; ++rank) {
      for (int i = 0; i < 300 && ReadFile(written + std::to_string(rank)).empty(); ++i) std::this_thread::sleep_for(100ms);
    }
    ASSERT_EQ(ReadFile(latest), "checkpoint-3\n");
    for (auto& process : first) process->Signal(SIGKILL);  // their guards stop the trainings
    Job::FinishAll(first);
  }
  for (int rank = 0; rank < 2; ++rank) {  // the markers: written as the launchers died
    std::string checkpoint_dir = ReadFile(written + std::to_string(rank));
    checkpoint_dir.erase(checkpoint_dir.find_last_not_of('\n') + 1);
    WriteFile(checkpoint_dir + "/step-4/.complete", "");
  }
  const std::string commits = scratch.path() + "/remote/" + kJobId + "/.bt-commits";
  const size_t records_after_the_first_run = CommitRecordsIn(commits);
  ASSERT_GT(records_after_the_first_run, 0u);
  auto retried = job.StartAll();
  auto results = Job::FinishAll(retried);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << results[rank].err;
    EXPECT_NE(results[rank].out.find("resumed checkpoint-3"), std::string::npos) << results[rank].out;
    EXPECT_NE(results[rank].err.find("checkpoint(s) on disk from before this launcher started are not committed"),
              std::string::npos) << results[rank].err;
  }
  EXPECT_EQ(ReadFile(latest), "checkpoint-3\n") << "the last run's step-4 was committed by the retry";
  EXPECT_EQ(CommitRecordsIn(commits), records_after_the_first_run) << "the retry committed a save of the last run";
}

// Review 4, F3: the killed run journaled nothing (its launchers were stopped before any
// handoff; step-1 completes by its marker, written as they died). Only a journal record told
// a retry from a first start, so the retry, starting from scratch, committed the last run's
// step-1. A start is recorded in the journal now.
TEST(Restart, ARetriedJobWhoseLastRunJournaledNothingCommitsNoneOfItsSaves) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string written = scratch.path() + "/written-";
  const std::string commands = nlohmann::json::array(
      {"if [ -e " + written + "$BT_NODE_RANK ]; then echo \"retried [$BT_RESUME_CHECKPOINT]\"; sleep 4; else "
       "mkdir -p $BT_CHECKPOINT_DIR/step-1 && head -c 50000 /dev/urandom > $BT_CHECKPOINT_DIR/step-1/payload.bin && "
       "echo $BT_CHECKPOINT_DIR > " + written + "$BT_NODE_RANK && exec sleep 60; fi"}).dump();
  nlohmann::json settings = RestartSettings(scratch, 0);
  settings["checkpoint"]["quiet_period_s"] = 60;  // step-1 completes by its marker only
  Job job(2, commands, "", true, settings, FreePort());
  {
    auto first = job.StartAll();
    for (int rank = 0; rank < 2; ++rank) {
      for (int i = 0; i < 300 && ReadFile(written + std::to_string(rank)).empty(); ++i) std::this_thread::sleep_for(100ms);
    }
    for (auto& process : first) process->Signal(SIGKILL);
    Job::FinishAll(first);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::string checkpoint_dir = ReadFile(written + std::to_string(rank));
    checkpoint_dir.erase(checkpoint_dir.find_last_not_of('\n') + 1);
    ASSERT_FALSE(checkpoint_dir.empty());
    WriteFile(checkpoint_dir + "/step-1/.complete", "");
  }
  auto retried = job.StartAll();
  auto results = Job::FinishAll(retried);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << results[rank].err;
    EXPECT_NE(results[rank].out.find("retried []"), std::string::npos) << results[rank].out;
    EXPECT_NE(results[rank].err.find("checkpoint(s) on disk from before this launcher started are not committed"),
              std::string::npos) << results[rank].err;
  }
  EXPECT_FALSE(fs::exists(latest)) << "the retry committed the last run's step-1: " << ReadFile(latest);
}

TEST(Restart, ARetriedJobResumesFromItsOwnCommittedCheckpoint) {
  TempDir scratch;
  const std::string report =
      "echo \"resumed $BT_RESUME_CHECKPOINT $(cat $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK/$BT_RESUME_CHECKPOINT/"
      "trainer_state.json)\"";
  const std::string commands =
      nlohmann::json::array({"if [ -n \"$BT_RESUME_CHECKPOINT\" ]; then " + report + "; else " + Save(3) + "; fi"}).dump();
  Job job(2, commands, "", true, RestartSettings(scratch, 0), FreePort());
  auto first = job.StartAll();
  for (auto& result : Job::FinishAll(first)) ASSERT_EQ(result.exit_code, 0) << result.err;
  ASSERT_EQ(ReadFile(scratch.path() + "/remote/" + kJobId + "/latest"), "checkpoint-3\n");
  auto retried = job.StartAll();  // the same job again: the platform retried it
  auto results = Job::FinishAll(retried);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << results[rank].err;
    EXPECT_NE(results[rank].out.find("resumed checkpoint-3 {\"global_step\": 3}"), std::string::npos)
        << results[rank].out << results[rank].err;
    EXPECT_NE(results[rank].err.find("resuming from checkpoint checkpoint-3: this job's destination already holds it"),
              std::string::npos) << results[rank].err;
  }
}

// Node 1's job dies by a signal in cycles 0 and 1, each after a new checkpoint is committed:
// a signal is a failure like an exit code, and cycle 2 finds only cycle 1's checkpoint in
// BT_LOAD_CHECKPOINT_DIR/rank-<r>/, nothing of cycle 1's own load beside it.
TEST(Restart, AJobKilledByASignalRestartsAndEachCycleLoadsOnlyItsCheckpoint) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  auto cycle = [&](int step) {
    return Save(step) + " && for i in $(seq 300); do grep -qx checkpoint-" + std::to_string(step) + " " + latest +
           " && break; sleep 0.1; done; if [ $BT_NODE_RANK = 1 ]; then kill -KILL $$; fi; exec sleep 60";
  };
  const std::string commands = nlohmann::json::array(
      {"case $BT_RESTART_COUNT in 0) " + cycle(1) + ";; 1) " + cycle(2) + ";; *) " + kReportResume + ";; esac"}).dump();
  Job job(2, commands, "", true, RestartSettings(scratch, 2), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find(ResumeReport(2, 2)),
              std::string::npos) << "node " << rank << ":\n" << results[rank].out << results[rank].err;
    EXPECT_NE(results[rank].err.find("failed: killed by signal KILL"), std::string::npos) << results[rank].err;
  }
}

// Node 1's own copy of checkpoint-3 was changed in place since its upload (same size, other
// bytes): checked against the manifest, it differs, and the committed bytes are downloaded
// instead. Node 0's copy matches and is linked.
TEST(Restart, AnOwnCopyChangedSinceItsUploadIsNotTrusted) {
  TempDir scratch;
  const std::string commands = nlohmann::json::array({"[ -n \"$BT_RESUME_CHECKPOINT\" ] || { " + Save(3) + "; }"}).dump();
  Job job(2, commands, "", true, RestartSettings(scratch, 0), FreePort());
  auto first = job.StartAll();
  for (auto& result : Job::FinishAll(first)) ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string node1 = job.dir().path() + "/root/node-1";
  const std::string own = node1 + "/mnt/ckpts/checkpoint-3/model.bin";
  const std::string committed = ReadFile(own);
  ASSERT_EQ(committed.size(), 100000u);
  WriteFile(own, std::string(committed.size(), 'x'));
  auto retried = job.StartAll();
  auto results = Job::FinishAll(retried);
  for (auto& result : results) EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(results[0].err.find("verified, linked from this node's own copy"), std::string::npos) << results[0].err;
  EXPECT_EQ(results[1].err.find("linked from this node's own copy"), std::string::npos) << results[1].err;
  EXPECT_NE(results[1].err.find("checkpoint-3 of job restart-job (3 files, 100022 bytes, verified)"), std::string::npos)
      << results[1].err;
  EXPECT_EQ(ReadFile(node1 + "/tmp/loaded_checkpoints/rank-1/checkpoint-3/model.bin"), committed)
      << "node 1 resumed from its changed copy, not the committed one";
}

// Each cycle after the first waits for `go`; every cycle says which it is on which node.
std::string CyclesWaitingFor(const std::string& go, const std::string& cycle0) {
  return nlohmann::json::array({"echo \"cycle $BT_RESTART_COUNT node $BT_NODE_RANK\"; if [ \"$BT_RESTART_COUNT\" = 0 ]; then " +
                                cycle0 + "; fi; while [ ! -e " + go + " ]; do sleep 0.1; done"}).dump();
}

// Node 2 is replaced; its replacement still waits for its weights when node 1 is lost too.
// Cycle 1 has not run, so the job stays in it (no second restart, review finding F5) and
// awaits rank 1 again; the preparing replacement is not disturbed (it once exited 69 at a
// push of cycle 2, and rank 2 could never be filled again), and with a replacement of
// node 1 the job runs cycle 1 and ends well.
TEST(Restart, AReplacementStillPreparingWhenAnotherNodeIsLostJoinsTheSameCycle) {
  TempDir scratch;
  const std::string go = scratch.path() + "/go";
  const std::string mount = scratch.path() + "/weights";
  WriteFile(mount + "/model.bin", "weights");
  WriteFile(mount + "/.complete", "");
  nlohmann::json settings = RestartSettings(scratch, 3, 3);
  settings["restart"]["rejoin_timeout_s"] = 40;
  settings["weights"] = {{"mode", "wait"}, {"timeout_s", 60}};
  Job job(3, CyclesWaitingFor(go, "exec sleep 60"), "", false, settings, FreePort());
  job.Amend({{"weights", {{{"source", "file://" + scratch.path() + "/src"}, {"mount_location", mount}}}}});
  auto processes = job.StartAll();
  // Node 0's command runs once it marked the run started: a loss before that ends the start.
  ASSERT_TRUE(processes[0]->WaitForOutput("cycle 0 node 0", 20s)) << processes[0]->Finish().err;
  ASSERT_TRUE(processes[2]->WaitForOutput("cycle 0 node 2", 20s));
  processes[2]->Signal(SIGKILL);
  processes[2]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("restarting every node in cycle 1", 20s));
  fs::remove(mount + "/.complete");  // the replacement's weights are not there yet
  processes[2] = std::make_unique<LauncherProcess>(job.Spec(2));
  ASSERT_TRUE(processes[2]->WaitForLog("weights: waiting for", 20s));
  ASSERT_TRUE(processes[0]->WaitForLog("joined again from", 5s));
  processes[1]->Signal(SIGKILL);
  processes[1]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("while cycle 1 waits to start: its rank is awaited again", 20s));
  std::this_thread::sleep_for(1s);  // node 1's loss is known while the replacement waits for its weights
  WriteFile(mount + "/.complete", "");
  processes[1] = std::make_unique<LauncherProcess>(job.Spec(1));
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(processes[rank]->WaitForOutput("cycle 1 node " + std::to_string(rank), 30s))
        << "node " << rank << " never ran cycle 1:\n" << processes[rank]->Finish().err;
  }
  WriteFile(go);
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_EQ(results[rank].out.find("cycle 2"), std::string::npos) << "a second restart was spent:\n" << results[rank].out;
  }
  EXPECT_NE(results[2].err.find("this launcher replaces a lost one: it meets the other nodes in cycle 1"),
            std::string::npos) << results[2].err;
}

// Node 1's job succeeded and reported; then its launcher was lost (its job's success
// stands). Node 2 fails later: the restart needs rank 1 again, so it awaits it and takes a
// replacement (it was refused as "not awaited", and the job ended 69).
TEST(Restart, ANodeLostAfterItsJobFinishedIsAwaitedAtTheNextRestart) {
  TempDir scratch;
  const std::string go = scratch.path() + "/go";
  const std::string fail = scratch.path() + "/fail";
  nlohmann::json settings = RestartSettings(scratch, 2, 3);
  settings["restart"]["rejoin_timeout_s"] = 40;
  const std::string cycle0 = "if [ $BT_NODE_RANK = 1 ]; then exit 0; fi; if [ $BT_NODE_RANK = 2 ]; then while [ ! -e " +
                             fail + " ]; do sleep 0.1; done; exit 1; fi; exec sleep 60";
  Job job(3, CyclesWaitingFor(go, cycle0), "", false, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[1]->WaitForOutput("cycle 0 node 1", 20s));
  std::this_thread::sleep_for(2s);  // its job's success is reported
  processes[1]->Signal(SIGKILL);
  processes[1]->Finish();
  std::this_thread::sleep_for(500ms);
  WriteFile(fail);
  ASSERT_TRUE(processes[0]->WaitForLog("restarting every node in cycle 1", 20s));
  processes[1] = std::make_unique<LauncherProcess>(job.Spec(1));
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(processes[rank]->WaitForOutput("cycle 1 node " + std::to_string(rank), 30s))
        << "node " << rank << " never ran cycle 1:\n" << processes[rank]->Finish().err;
  }
  WriteFile(go);
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
  EXPECT_NE(results[0].err.find("joined again from"), std::string::npos) << results[0].err;
}

// An rclone destination (s3://) with restarts on: node 0's restart policy reads `latest`
// through rclone before the rendezvous, and that child's SIGCHLD, pending on the launcher's
// signalfd, interrupted node 0's lookup of the leader's name (every node 69, "interrupted
// while resolving the leader's name"). The rclone is a script first in PATH that finds no
// `latest`.
TEST(Restart, AnRcloneDestinationsEarlyChildDoesNotInterruptTheRendezvous) {
  TempDir scratch;
  scratch.Write("bin/rclone", "#!/bin/sh\n"
                              "case \"$1\" in\n"
                              "  copyto) exit 3 ;;\n"  // not found
                              "  *) exit 1 ;;\n"
                              "esac\n");
  fs::permissions(scratch.path() + "/bin/rclone", fs::perms::owner_all);
  nlohmann::json settings = RestartSettings(scratch, 1);
  settings["checkpoint"]["destination"] = "s3://ckpts/prefix";
  Job job(2, R"(["echo ran"])", "", true, settings, FreePort());
  const std::map<std::string, std::string> env = {{"PATH", scratch.path() + "/bin:" + std::getenv("PATH")},
                                                  {"AWS_ACCESS_KEY_ID", "test-key-id"},
                                                  {"AWS_SECRET_ACCESS_KEY", "test-secret-key-value"},
                                                  {"AWS_REGION", "us-east-1"}};
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 2; ++rank) processes.push_back(std::make_unique<LauncherProcess>(job.Spec(rank, {}, env)));
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("ran"), std::string::npos) << results[rank].out;
    EXPECT_EQ(results[rank].err.find("interrupted"), std::string::npos) << results[rank].err;
  }
}

// Node 0's launcher freezes (SIGSTOP: to node 1, as a partition) after node 1 uploaded its
// part of checkpoint-1, which node 0 never declared. Node 1 hears the leader is lost, stops
// its job, and its drain stops waiting for a commit that cannot come: it exits 69 within
// seconds (it waited out drain_timeout_s, 60 s here, and exited 74), its part in its journal.
TEST(Restart, AFollowerCutOffFromNodeZeroDrainsOnlyItsOwnUploadsAndExitsPromptly) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 0);
  settings["checkpoint"]["drain_timeout_s"] = 60;
  const std::string commands = nlohmann::json::array(
      {"echo $$ > $BT_SCRATCH_DIR/../../training.pid; if [ $BT_NODE_RANK = 1 ]; then " + Save(1) +
       "; fi; echo started; exec sleep 120"}).dump();
  Job job(2, commands, "", true, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[1]->WaitForLog("checkpoints: uploaded checkpoint-1", 30s)) << processes[1]->Finish().err;
  processes[0]->Signal(SIGSTOP);
  const auto frozen = std::chrono::steady_clock::now();
  const ProcessResult follower = processes[1]->Finish();
  const auto took = std::chrono::steady_clock::now() - frozen;
  KillNodeHard(job, *processes[0], 0);
  processes[0]->Finish();
  EXPECT_EQ(follower.exit_code, 69) << follower.err;
  // heartbeat_timeout_s 3, the job's stop, the drain's check: well inside drain_timeout_s.
  EXPECT_LT(took, 20s) << follower.err;
  EXPECT_NE(follower.err.find("leader (node 0) lost"), std::string::npos) << follower.err;
  EXPECT_NE(follower.err.find("checkpoints: node 0 is lost, so nothing can be committed"), std::string::npos)
      << follower.err;
  EXPECT_NE(follower.err.find("checkpoint-1 was not committed: the connection to node 0 is gone"), std::string::npos) << follower.err;
  const std::string journal = job.dir().path() + "/root/node-1/mnt/ckpts/.bt-checkpoint/journal.jsonl";
  EXPECT_NE(ReadFile(journal).find("checkpoint-1"), std::string::npos) << "the journal lost node 1's part";
}

// DDP's usual pattern: only rank 0 saves. Node 1 answers "no part", the commit record lists
// node 0's part only, and at the restart node 1 runs with an empty rank-1/ (it failed the
// job with 74, "has no part for node 1").
TEST(Restart, OnlyNodeZeroSavesAndNodeOneRestartsWithAnEmptyFolder) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string cycle0 = "if [ $BT_NODE_RANK = 0 ]; then " + Save(4) + "; fi; " + WaitFor(latest) +
                             "; if [ $BT_NODE_RANK = 1 ]; then exit 1; fi; exec sleep 60";
  const std::string later = "echo \"cycle $BT_RESTART_COUNT resume $BT_RESUME_CHECKPOINT node $BT_NODE_RANK has "
                            "[$(ls -A $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK | tr '\\n' ' ')]\"";
  Job job(2, Commands(cycle0, later), "", true, RestartSettings(scratch, 1), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
  }
  EXPECT_NE(results[0].out.find("cycle 1 resume checkpoint-4 node 0 has [checkpoint-4 ]"), std::string::npos)
      << results[0].out << results[0].err;
  EXPECT_NE(results[1].out.find("cycle 1 resume checkpoint-4 node 1 has []"), std::string::npos)
      << results[1].out << results[1].err;
  EXPECT_NE(results[1].err.find("checkpoint checkpoint-4 of job restart-job has no part for node 1 (its commit record "
                                "lists none)"),
            std::string::npos) << results[1].err;
}

// `latest` cannot be read when node 0 decides (here a directory: any read fails). Node 0
// knows what it committed; every node resumes from it instead of silently from scratch.
TEST(Restart, ALatestUnreadableAtTheDecisionStillResumesFromTheCommitNodeZeroMade) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string cycle0 = Save(3) + " && " + WaitFor(latest) + " && if [ $BT_NODE_RANK = 1 ]; then rm " + latest +
                             " && mkdir " + latest + " && exit 1; fi; exec sleep 60";
  const std::string later = "if [ $BT_NODE_RANK = 0 ]; then rmdir " + latest + " && echo checkpoint-3 > " + latest +
                            "; fi; " + kReportResume;
  Job job(2, Commands(cycle0, later), "", true, RestartSettings(scratch, 1), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find(ResumeReport(1, 3)),
              std::string::npos) << "node " << rank << ":\n" << results[rank].out << results[rank].err;
    EXPECT_NE(results[rank].err.find("resumed from checkpoint-3, restarts 1/1"), std::string::npos) << results[rank].err;
  }
}

// Reading `latest` blocks (a FIFO stands for a destination that stopped answering) while
// node 0 decides. The decision reads nothing, so the leader's heartbeats go on and the
// job restarts; it ended 69 ("leader lost") on every follower.
TEST(Restart, ADestinationThatBlocksDuringTheDecisionDoesNotStopTheLeader) {
  TempDir scratch;
  const std::string remote = scratch.path() + "/remote/" + kJobId;
  const std::string cycle0 = "if [ $BT_NODE_RANK = 1 ]; then mkdir -p " + remote + " && mkfifo " + remote +
                             "/latest && exit 1; fi; exec sleep 60";
  const std::string later = "if [ $BT_NODE_RANK = 0 ]; then rm -f " + remote + "/latest; fi; echo \"cycle $BT_RESTART_COUNT "
                            "from [$BT_RESUME_CHECKPOINT]\"";
  Job job(2, Commands(cycle0, later), "", true, RestartSettings(scratch, 1), FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("cycle 1 from []"), std::string::npos) << results[rank].out << results[rank].err;
  }
  EXPECT_NE(results[0].err.find("every node runs cycle 1, from scratch: nothing of this job is committed yet"),
            std::string::npos) << results[0].err;
}

// A job that saves `state.pt` every cycle (one name, a new commit each time) makes progress
// every cycle; with max_cycles_without_progress 1 it was stopped at its second failure.
TEST(Restart, ANameSavedAgainEveryCycleIsProgress) {
  TempDir scratch;
  const std::string commits = scratch.path() + "/remote/" + kJobId + "/.bt-commits";
  const std::string records = "$(cat " + commits + "/*.json 2>/dev/null | md5sum)";
  const std::string cycle = "before=\"" + records + "\"; head -c 1000 /dev/urandom > $BT_CHECKPOINT_DIR/state.pt; " +
                            "for i in $(seq 300); do [ \"" + records + "\" != \"$before\" ] && break; sleep 0.1; done; " +
                            "if [ $BT_NODE_RANK = 1 ]; then exit 1; fi; exec sleep 60";
  const std::string commands = nlohmann::json::array(
      {"case $BT_RESTART_COUNT in 0|1) " + cycle + ";; *) echo \"cycle $BT_RESTART_COUNT ran\";; esac"}).dump();
  nlohmann::json settings = RestartSettings(scratch, 3);
  settings["restart"]["max_cycles_without_progress"] = 1;
  Job job(2, commands, "", true, settings, FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("cycle 2 ran"), std::string::npos) << results[rank].out << results[rank].err;
  }
  EXPECT_EQ(results[0].err.find("not restarting"), std::string::npos) << results[0].err;
}

// Node 1's launcher is lost; its replacement joins in cycle 1. Nothing of this job is
// committed, so the others still hold what runtime.load_checkpoint_config loaded before
// cycle 0: the replacement loads it too (it ran with an empty BT_LOAD_CHECKPOINT_DIR).
TEST(Restart, AReplacementLoadsTheLoadCheckpointConfigTheOthersLoaded) {
  TempDir scratch;
  // An earlier job, "first-job", committed checkpoint-5 with a part for each of 2 nodes.
  nlohmann::json first_settings = RestartSettings(scratch, 0);
  first_settings["job_id"] = "first-job";
  Job first(2, nlohmann::json::array({Save(5)}).dump(), "", true, first_settings, FreePort());
  auto first_processes = first.StartAll();
  for (auto& result : Job::FinishAll(first_processes)) ASSERT_EQ(result.exit_code, 0) << result.err;

  const std::string commands = nlohmann::json::array(
      {"echo $$ > $BT_SCRATCH_DIR/../../training.pid; echo \"cycle $BT_RESTART_COUNT node $BT_NODE_RANK loaded "
       "[$(ls -A $BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK | tr '\\n' ' ')]\"; "
       "if [ \"$BT_RESTART_COUNT\" = 0 ]; then exec sleep 60; fi"}).dump();
  nlohmann::json settings = RestartSettings(scratch, 1, 3);
  settings["restart"]["rejoin_timeout_s"] = 40;
  Job job(2, commands, "", false, settings, FreePort());
  job.Amend({{"runtime",
                    {{"load_checkpoint_config",
                      {{"enabled", true},
                       {"checkpoints", {{{"typ", "baseten_latest_checkpoint"}, {"job_id", "first-job"}}}}}}}}});
  auto processes = job.StartAll();
  // Node 0's command runs once it marked the run started: a loss before that ends the start.
  ASSERT_TRUE(processes[0]->WaitForOutput("cycle 0 node 0 loaded", 30s)) << processes[0]->Finish().err;
  ASSERT_TRUE(processes[1]->WaitForOutput("cycle 0 node 1 loaded [checkpoint-5 ]", 30s)) << processes[1]->Finish().err;
  KillNodeHard(job, *processes[1], 1);
  processes[1]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("lost: its launcher has not joined again)", 30s));
  // The replacement comes up on a fresh volume (a new pod): nothing of its predecessor's load.
  fs::remove_all(job.dir().path() + "/root/node-1/tmp/loaded_checkpoints");
  processes[1] = std::make_unique<LauncherProcess>(job.Spec(1));
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;
    EXPECT_NE(results[rank].out.find("cycle 1 node " + std::to_string(rank) + " loaded [checkpoint-5 ]"),
              std::string::npos) << "node " << rank << ":\n" << results[rank].out << results[rank].err;
  }
}

// Node 1's resume download at a restart never ends (rclone stuck on a dead network: a script
// first in PATH serves an s3 destination from a local tree, and hangs on downloads once the
// job has failed). SIGTERM to `signalled` (node 1 itself, or node 0, whose stop aborts the
// job) ends node 1 at once, rclone killed; it waited for the download.
void StopDuringAStuckResumeDownload(int signalled) {
  TempDir scratch;
  const std::string bucket = scratch.path() + "/s3";
  const std::string hang = scratch.path() + "/hang";
  const std::string started = scratch.path() + "/download-started";
  fs::create_directories(scratch.path() + "/bin");
  scratch.Write("bin/rclone", "#!/bin/sh\n"  // bt-launch puts the subcommand and its arguments first
                              "at() { case \"$1\" in btdest:*) echo \"" + bucket + "/${1#btdest:}\" ;; *) echo \"$1\" ;; esac; }\n"
                              "case \"$1\" in\n"
                              "  copy) from=$(at \"$5\"); to=$(at \"$6\")\n"
                              "    case \"$5\" in btdest:*) if [ -e " + hang + " ]; then echo $$ > " + started +
                              "; exec sleep 300; fi ;; esac\n"
                              "    while IFS= read -r f; do mkdir -p \"$to/$(dirname \"$f\")\" && cp \"$from/$f\" \"$to/$f\" || exit 3; "
                              "done < \"$3\" ;;\n"
                              "  copyto) from=$(at \"$2\"); to=$(at \"$3\"); [ -e \"$from\" ] || exit 3\n"
                              "    mkdir -p \"$(dirname \"$to\")\" && cp \"$from\" \"$to.tmp\" && mv \"$to.tmp\" \"$to\" ;;\n"
                              "  *) exit 1 ;;\n"
                              "esac\n");
  fs::permissions(scratch.path() + "/bin/rclone", fs::perms::owner_all);
  const std::string latest = bucket + "/ckpts/prefix/" + kJobId + "/latest";
  // Node 1 drops its own copy, so that the restart downloads its part instead of linking it.
  const std::string cycle0 = Save(1) + " && " + WaitFor(latest) +
                             " && if [ $BT_NODE_RANK = 1 ]; then rm -rf $BT_CHECKPOINT_DIR/checkpoint-1 && touch " + hang +
                             " && exit 1; fi; exec sleep 60";
  nlohmann::json settings = RestartSettings(scratch, 1, 3);
  settings["checkpoint"]["destination"] = "s3://ckpts/prefix";
  Job job(2, Commands(cycle0, "echo \"cycle $BT_RESTART_COUNT ran\""), "", true, settings, FreePort());
  const std::map<std::string, std::string> env = {{"PATH", scratch.path() + "/bin:" + std::getenv("PATH")},
                                                  {"AWS_ACCESS_KEY_ID", "test-key-id"},
                                                  {"AWS_SECRET_ACCESS_KEY", "test-secret-key-value"},
                                                  {"AWS_REGION", "us-east-1"}};
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 2; ++rank) processes.push_back(std::make_unique<LauncherProcess>(job.Spec(rank, {}, env)));
  for (int waited = 0; waited < 600 && !fs::exists(started); ++waited) std::this_thread::sleep_for(50ms);
  if (!fs::exists(started)) {
    for (auto& process : processes) process->Signal(SIGKILL);
    FAIL() << "the resume download never started: " << processes[1]->Finish().err;
  }
  std::this_thread::sleep_for(200ms);  // the pid is written
  const pid_t rclone = std::atoi(ReadFile(started).c_str());
  const auto signalled_at = std::chrono::steady_clock::now();
  processes[size_t(signalled)]->Signal(SIGTERM);
  const ProcessResult node1 = processes[1]->Finish();
  const auto node1_ended = std::chrono::steady_clock::now() - signalled_at;
  const ProcessResult node0 = processes[0]->Finish();
  const bool rclone_alive = rclone > 0 && kill(rclone, 0) == 0;
  if (rclone_alive) kill(rclone, SIGKILL);  // the test's own cleanup
  EXPECT_FALSE(rclone_alive) << "the stuck download's rclone outlived the launcher";
  EXPECT_LT(node1_ended, 10s) << node1.err;
  EXPECT_NE(node1.exit_code, 0) << node1.err;
  if (signalled == 1) {
    EXPECT_EQ(node1.exit_code, 143) << node1.err;
  }
  EXPECT_NE(node1.err.find("the load for cycle 1 was stopped"), std::string::npos) << node1.err;
  for (const ProcessResult* result : {&node0, &node1}) {
    EXPECT_EQ(result->out.find("cycle 1 ran"), std::string::npos) << result->out << result->err;
  }
}

TEST(Restart, SigtermDuringAStuckResumeDownloadEndsTheNodeAtOnce) { StopDuringAStuckResumeDownload(1); }

TEST(Restart, AnotherNodesStopDuringAStuckResumeDownloadEndsTheNodeAtOnce) { StopDuringAStuckResumeDownload(0); }

// Soak finding F2: node 0's launcher frozen (SIGSTOP) longer than the heartbeat timeout. Its
// follower takes the leader as lost and exits 69. Node 0, running again, counted its own
// silence as the others' (and its own client's) loss: a restart per node, a cycle waiting
// rejoin_timeout_s (60 s here) for node 0 itself, then the drain, and 74. Now node 0 sees it
// did not run itself and ends the job at once: 69 on both nodes, within seconds.
TEST(Restart, NodeZeroFrozenPastTheHeartbeatTimeoutEndsTheJobAtOnceWithTheFollowersCode) {
  TempDir scratch;
  Job job(2, "[\"echo started; exec sleep 120\"]", "", true, RestartSettings(scratch, 2), FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[0]->WaitForLog("started", 30s)) << processes[0]->Finish().err;
  processes[0]->Signal(SIGSTOP);
  std::this_thread::sleep_for(6s);  // heartbeat_timeout_s is 3
  processes[0]->Signal(SIGCONT);
  const auto resumed = std::chrono::steady_clock::now();
  const ProcessResult leader = processes[0]->Finish();
  const auto took = std::chrono::steady_clock::now() - resumed;
  const ProcessResult follower = processes[1]->Finish();
  EXPECT_EQ(follower.exit_code, 69) << follower.err;
  EXPECT_EQ(leader.exit_code, 69) << leader.err;
  EXPECT_LT(took, 20s) << leader.err;
  EXPECT_EQ(leader.err.find("restart 1/2"), std::string::npos) << "node 0 spent a restart on its own freeze: " << leader.err;
}

// Review 14, F3: a follower's launcher frozen (SIGSTOP) past the heartbeat timeout is taken
// for lost by node 0, which goes on without it. Thawed, it said "leader (node 0) lost:
// connection closed" though node 0 never was; now it reads node 0's last frame and says it
// was the one taken for lost.
TEST(Restart, AFollowerFrozenPastTheHeartbeatTimeoutIsToldNodeZeroTookItForLost) {
  TempDir scratch;
  nlohmann::json settings = RestartSettings(scratch, 2, 3);
  settings["restart"]["rejoin_timeout_s"] = 30;
  Job job(2, "[\"[ $BT_RESTART_COUNT = 0 ] && echo started && exec sleep 120; echo cycle $BT_RESTART_COUNT\"]", "",
          true, settings, FreePort());
  auto processes = job.StartAll();
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 30s)) << processes[1]->Finish().err;
  processes[1]->Signal(SIGSTOP);
  ASSERT_TRUE(processes[0]->WaitForLog("lost: no heartbeat for", 20s)) << processes[0]->Finish().err;
  processes[1]->Signal(SIGCONT);
  const ProcessResult frozen = processes[1]->Finish();
  EXPECT_EQ(frozen.exit_code, 69) << frozen.err;
  EXPECT_NE(frozen.err.find("node 0 took this launcher, node 1 ("), std::string::npos) << frozen.err;
  EXPECT_NE(frozen.err.find("for lost: no heartbeat for"), std::string::npos) << frozen.err;
  EXPECT_EQ(frozen.err.find("leader (node 0) lost"), std::string::npos) << frozen.err;
  // A new launcher in its slot finishes the job.
  LauncherProcess replacement(job.Spec(1));
  const ProcessResult leader = processes[0]->Finish();
  EXPECT_EQ(leader.exit_code, 0) << leader.err;
  EXPECT_EQ(replacement.Finish().exit_code, 0);
}

}  // namespace restart

// Issue 30: node health over the fake NVML (tests/health/fake_nvml.c), one state file per
// node, which the test changes while the job runs.
std::map<std::string, std::string> FakeNvml(const std::string& state) {
  return {{"BT_NVML_LIBRARY", BT_FAKE_NVML}, {"BT_FAKE_NVML_STATE", state}};
}

// Written whole (the fake reads it at every call): a temporary beside it, renamed over it.
void WriteNvmlState(const std::string& path, const std::string& text) {
  WriteFile(path + ".tmp", text);
  fs::rename(path + ".tmp", path);
}

TEST(Health, AnUncorrectableEccErrorAtTheStartIsNamedOnNodeZeroBeforeAnyCommandRuns) {
  TempDir scratch;
  const std::string ran = scratch.path() + "/ran-";
  Job job(3, "[\"touch " + ran + "$BT_NODE_RANK\"]", "", false);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 3; ++rank) {
    const std::string state = scratch.path() + "/nvml-" + std::to_string(rank);
    WriteNvmlState(state, "gpus 2\ngpu 1 uuid GPU-node" + std::to_string(rank) + "-1\n" +
                              (rank == 2 ? "gpu 1 ecc_uncorrected 3\n" : ""));
    processes.push_back(std::make_unique<LauncherProcess>(job.Spec(rank, {}, FakeNvml(state))));
  }
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[2].exit_code, 75) << results[2].err;
  EXPECT_NE(results[2].err.find("this node cannot train"), std::string::npos) << results[2].err;
  const std::string& leader = results[0].err;
  const size_t table = leader.find("a node cannot train (launcher.health)");
  ASSERT_NE(table, std::string::npos) << leader;
  EXPECT_NE(leader.find("GPU-node2-1", table), std::string::npos) << leader;
  EXPECT_NE(leader.find("ECC", table), std::string::npos) << leader;
  EXPECT_EQ(leader.find("GPU-node1-1", table), std::string::npos) << "a healthy GPU is in the table: " << leader;
  EXPECT_NE(results[0].exit_code, 0);
  for (int rank = 0; rank < 3; ++rank) EXPECT_FALSE(fs::exists(ran + std::to_string(rank))) << "node " << rank << " ran";
}

TEST(Health, FewerGpusThanExpectedKeepTheNodeFromTraining) {
  TempDir scratch;
  const std::string state = scratch.path() + "/nvml";
  WriteNvmlState(state, "gpus 7\n");
  Job job(1, R"(["echo ran"])", "", false, {{"health", {{"expect_gpus", 8}}}});
  ProcessResult result = RunLauncher(job.Spec(0, {}, FakeNvml(state)));
  EXPECT_EQ(result.exit_code, 75) << result.err;
  EXPECT_NE(result.err.find("7"), std::string::npos) << result.err;
  EXPECT_EQ(result.out.find("ran"), std::string::npos) << result.out;
}

TEST(Health, HealthRequiredWithoutNvmlFailsTheNodeNamingTheLibrary) {
  Job job(1, R"(["echo ran"])", "", false, {{"health", {{"enabled", true}}}});
  ProcessResult result = RunLauncher(job.Spec(0, {}, {{"BT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}}));
  EXPECT_EQ(result.exit_code, 75) << result.err;
  EXPECT_NE(result.err.find("NVML not available"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("/nonexistent/libnvidia-ml.so.1"), std::string::npos) << result.err;
}

// Xid 13 (a graphics engine exception) is the application's: a warning, the job goes on.
TEST(Health, AnApplicationXidIsAWarningAndTheJobGoesOn) {
  TempDir scratch;
  const std::string state = scratch.path() + "/nvml";
  WriteNvmlState(state, "gpus 2\n");
  Job job(1, R"(["echo started; sleep 3; echo finished"])", "", false, {{"health", {{"interval_s", 0.5}}}});
  LauncherProcess launcher(job.Spec(0, {}, FakeNvml(state)));
  ASSERT_TRUE(launcher.WaitForOutput("started", 20s));
  WriteNvmlState(state, "gpus 2\nxid 1 0 13\n");
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("finished"), std::string::npos) << result.out;
  EXPECT_NE(result.err.find("warning: GPU 0"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("Xid 13"), std::string::npos) << result.err;
}

// The InfiniBand ports the fabric plan gave NCCL, read again while the job runs (a copy of
// tests/fixtures/health/ib2-counters per node): node 0's symbol_error counter grows (a
// warning: the job goes on), then node 1's mlx5_1 port goes DOWN (fatal: node 1 stops,
// named, and with no restart the job ends with its 75).
TEST(Health, AUsedPortGoingDownStopsItsNodeAndAGrowingCounterIsAWarning) {
  TempDir scratch;
  std::vector<std::string> roots;
  for (int rank = 0; rank < 2; ++rank) {
    roots.push_back(scratch.path() + "/node-" + std::to_string(rank));
    fs::copy(std::string(BT_SOURCE_DIR) + "/tests/fixtures/health/ib2-counters", roots.back(),
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  }
  // Node 1 is another host: its HCAs have GUIDs of their own (the fabric check refuses copies).
  for (const char* device : {"0000:1a:00.0/infiniband/mlx5_0", "0000:3c:00.0/infiniband/mlx5_1"}) {
    const std::string hca = roots[1] + "/sys/devices/pci0000:00/" + device;
    for (const std::string file : {"/node_guid", "/sys_image_guid", "/ports/1/gids/0"}) {
      std::string text = ReadFile(hca + file);
      text.replace(text.find("a088"), 4, "b088");
      WriteFile(hca + file, text);
    }
  }
  Job job(2, R"(["echo started; exec sleep 60"])", "", false, {{"health", {{"interval_s", 0.3}}}});
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 2; ++rank) {
    processes.push_back(std::make_unique<LauncherProcess>(
        job.Spec(rank, {"--sysfs-root", roots[size_t(rank)] + "/sys"}, {{"BT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}})));
  }
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 30s));
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 30s));
  const std::string port0 = roots[0] + "/sys/devices/pci0000:00/0000:1a:00.0/infiniband/mlx5_0/ports/1";
  WriteFile(port0 + "/counters/symbol_error", "2\n");
  ASSERT_TRUE(processes[0]->WaitForLog("symbol_error growing", 10s));
  const std::string port1 = roots[1] + "/sys/devices/pci0000:00/0000:3c:00.0/infiniband/mlx5_1/ports/1";
  WriteFile(port1 + "/state", "1: DOWN\n");
  WriteFile(port1 + "/phys_state", "2: Polling\n");
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 75) << results[1].err;
  EXPECT_NE(results[1].err.find("mlx5_1 port 1 not ACTIVE/LinkUp"), std::string::npos) << results[1].err;
  // 75 is "replace this node": the node whose port went down says it, the other exits 69 (a
  // peer failed), or an orchestrator replacing 75s would recreate both.
  EXPECT_EQ(results[0].exit_code, 69) << results[0].err;
  EXPECT_NE(results[0].err.find("mlx5_1 port 1 not ACTIVE/LinkUp"), std::string::npos) << results[0].err;
  EXPECT_NE(results[0].err.find("warning: NIC 0000:1a:00.0: mlx5_0 port 1 symbol_error growing = 0 -> 2"),
            std::string::npos) << results[0].err;
}

// The launcher's CPU time so far (utime + stime, in clock ticks), from /proc.
long CpuTicksOf(pid_t pid) {
  std::string stat = ReadFile("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream fields(stat.substr(stat.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int index = 3; fields >> field; ++index) {  // field 3 is the state, after "pid (comm)"
    if (index == 14) utime = std::stol(field);
    if (index == 15) stime = std::stol(field);
  }
  return utime + stime;
}

// A GPU lost while the job runs makes every Xid wait fail at once: the health watch must not
// spin on it beside the training (on_unhealthy "warn", so the job goes on).
TEST(Health, AnXidWaitThatFailsAtOnceIsNoBusyLoop) {
  TempDir scratch;
  const std::string state = scratch.path() + "/nvml";
  WriteNvmlState(state, "gpus 2\n");
  Job job(1, R"(["echo started; sleep 4; echo finished"])", "", false,
          {{"health", {{"interval_s", 30}, {"on_unhealthy", "warn"}}}});
  LauncherProcess launcher(job.Spec(0, {}, FakeNvml(state)));
  ASSERT_TRUE(launcher.WaitForOutput("started", 20s));
  WriteNvmlState(state, "gpus 2\ngpu 1 lost 1\n");
  std::this_thread::sleep_for(500ms);
  const long before = CpuTicksOf(launcher.pid());
  std::this_thread::sleep_for(2s);
  const long used = CpuTicksOf(launcher.pid()) - before;
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_LT(used, sysconf(_SC_CLK_TCK) / 5) << "the launcher used " << used << " ticks in 2 s: " << result.err;
  EXPECT_NE(result.err.find("GPU lost"), std::string::npos) << result.err;
}

// Xid 79 (fallen off the bus) on node 1 while it trains: its job is stopped at once, blamed
// on that GPU; node 1 leaves (75) instead of restarting on it, and the job goes on with a
// launcher that joins in its slot (no spare: a replaced pod).
TEST(Health, AGpuOffTheBusStopsItsNodeWhichLeavesAndAReplacementFinishesTheJob) {
  TempDir scratch;
  const std::string commands = nlohmann::json::array(
      {"if [ $BT_RESTART_COUNT = 0 ]; then echo started; exec sleep 60; else echo \"cycle $BT_RESTART_COUNT done\"; fi"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["health"] = {{"interval_s", 1}};
  Job job(2, commands, "", true, settings);
  std::vector<std::string> states;
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int rank = 0; rank < 2; ++rank) {
    states.push_back(scratch.path() + "/nvml-" + std::to_string(rank));
    WriteNvmlState(states.back(), "gpus 4\ngpu 3 uuid GPU-falling-3\n");
    processes.push_back(std::make_unique<LauncherProcess>(job.Spec(rank, {}, FakeNvml(states.back()))));
  }
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 30s));
  const auto xid = std::chrono::steady_clock::now();
  WriteNvmlState(states[1], "gpus 4\ngpu 3 uuid GPU-falling-3\nxid 1 3 79\n");
  ProcessResult left = processes[1]->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - xid, 15s);
  EXPECT_EQ(left.exit_code, 75) << left.err;
  const size_t last = left.err.rfind("this node left the job");
  ASSERT_NE(last, std::string::npos) << left.err;
  EXPECT_NE(left.err.find("GPU 3 (GPU-falling-3", last), std::string::npos) << left.err;
  EXPECT_NE(left.err.find("Xid 79", last), std::string::npos) << left.err;
  ASSERT_TRUE(processes[0]->WaitForLog("waiting", 30s));
  const std::string healthy = scratch.path() + "/nvml-replacement";
  WriteNvmlState(healthy, "gpus 4\n");
  LauncherProcess replacement(job.Spec(1, {}, FakeNvml(healthy)));
  ProcessResult leader = processes[0]->Finish();
  ProcessResult replaced = replacement.Finish();
  EXPECT_EQ(leader.exit_code, 0) << leader.err;
  EXPECT_EQ(replaced.exit_code, 0) << replaced.err;
  EXPECT_NE(leader.out.find("cycle 1 done"), std::string::npos) << leader.out;
  EXPECT_NE(replaced.out.find("cycle 1 done"), std::string::npos) << replaced.out;
  EXPECT_NE(leader.err.find("Xid 79"), std::string::npos) << "node 0 did not name the cause: " << leader.err;
}


// Issue 30, point 3: hot spares (launcher.spares). The job's launchers are node_count +
// spares; the last ones prepare and wait, and take a leaving node's training rank.
namespace spares {

using restart::Commands;
using restart::kJobId;
using restart::kReportResume;
using restart::Save;
using restart::WaitFor;

// Node `slot`'s launcher of a job with `spares` spares: every launcher counts in BT_GROUP_SIZE.
LaunchSpec SpareJobSpec(Job& job, int slot, int launchers, std::map<std::string, std::string> env = {}) {
  env["BT_GROUP_SIZE"] = std::to_string(launchers);
  return job.Spec(slot, {}, env);
}

// A job of two ranks and one spare whose three launchers each read a fake NVML state file of
// their own (`nvml-<slot>`, GPU 1 named `uuid`), written before they start, node 0's with
// `node_zero_lines` added (a finding at the start); `env` for every launcher.
struct TwoRanksAndASpare {
  std::vector<std::string> states;
  std::vector<std::unique_ptr<LauncherProcess>> processes;

  std::string uuid;

  TwoRanksAndASpare(Job& job, const TempDir& scratch, std::string gpu_uuid,
                    const std::map<std::string, std::string>& env = {}, const std::string& node_zero_lines = "")
      : uuid(std::move(gpu_uuid)) {
    for (int slot = 0; slot < 3; ++slot) {
      states.push_back(scratch.path() + "/nvml-" + std::to_string(slot));
      WriteNvmlState(states.back(), "gpus 2\ngpu 1 uuid " + uuid + "\n" + (slot == 0 ? node_zero_lines : ""));
      std::map<std::string, std::string> launcher_env = FakeNvml(states.back());
      launcher_env.insert(env.begin(), env.end());
      processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3, launcher_env)));
    }
  }
  // GPU 1 of node 0 falls off the bus.
  void XidOnNodeZero() { WriteNvmlState(states[0], "gpus 2\ngpu 1 uuid " + uuid + "\nxid 1 1 79\n"); }
};

// Xid 79 on GPU 3 of node 1 while it trains: node 1 leaves (75) naming the GPU, and the
// spare (slot 3) runs rank 1 from the committed checkpoint in the next cycle; then a
// launcher started again in slot 1 joins as a new spare, and the job finishes.
TEST(Spares, AGpuOffTheBusMovesItsRankToTheSpareWhichResumesFromTheCommittedCheckpoint) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string go_on = scratch.path() + "/go-on";
  const std::string cycle0 = Save(4) + " && " + WaitFor(latest) + " && echo started; exec sleep 60";
  const std::string later = std::string(kReportResume) + "; echo \"rank $BT_NODE_RANK of $BT_GROUP_SIZE NNODES=$NNODES "
                            "MASTER_ADDR=$MASTER_ADDR\"; " + WaitFor(go_on);
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["health"] = {{"interval_s", 1}};
  settings["spares"] = 1;
  Job job(3, Commands(cycle0, later), "", true, settings);
  std::vector<std::string> states;
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 4; ++slot) {
    states.push_back(scratch.path() + "/nvml-" + std::to_string(slot));
    WriteNvmlState(states.back(), "gpus 4\ngpu 3 uuid GPU-falling-3\n");
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 4, FakeNvml(states.back()))));
  }
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 40s)) << processes[1]->Finish().err;
  ASSERT_TRUE(processes[0]->WaitForLog("is a ready spare", 10s)) << processes[0]->Finish().err;
  const auto xid = std::chrono::steady_clock::now();
  WriteNvmlState(states[1], "gpus 4\ngpu 3 uuid GPU-falling-3\nxid 1 3 79\n");
  ProcessResult left = processes[1]->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - xid, 15s);
  EXPECT_EQ(left.exit_code, 75) << left.err;
  const size_t last = left.err.rfind("this node left the job");
  ASSERT_NE(last, std::string::npos) << left.err;
  EXPECT_NE(left.err.find("GPU 3 (GPU-falling-3", last), std::string::npos) << left.err;
  EXPECT_NE(left.err.find("Xid 79", last), std::string::npos) << left.err;
  // The spare runs rank 1 from checkpoint-4, its part of rank 1 loaded, within seconds.
  ASSERT_TRUE(processes[3]->WaitForOutput("rank 1 of 3", 20s)) << processes[3]->Finish().err;
  EXPECT_LT(std::chrono::steady_clock::now() - xid, 20s);
  // A launcher started again in slot 1 (the replaced pod) is a spare now.
  const std::string healthy = scratch.path() + "/nvml-replacement";
  WriteNvmlState(healthy, "gpus 4\n");
  LauncherProcess replacement(SpareJobSpec(job, 1, 4, FakeNvml(healthy)));
  EXPECT_TRUE(replacement.WaitForLog("this node is a hot spare", 30s));
  WriteFile(go_on, "1");
  std::vector<ProcessResult> results;
  for (int slot : {0, 2, 3}) results.push_back(processes[size_t(slot)]->Finish());
  ProcessResult again = replacement.Finish();
  for (const ProcessResult& result : results) {
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("cycle 1 torchelastic 1 resume checkpoint-4 {\"global_step\": 4}"), std::string::npos)
        << result.out << result.err;
    EXPECT_NE(result.out.find("NNODES=3 MASTER_ADDR=127.0.0.1"), std::string::npos) << result.out;
  }
  EXPECT_NE(results[0].out.find("rank 0 of 3"), std::string::npos) << results[0].out;
  EXPECT_NE(results[1].out.find("rank 2 of 3"), std::string::npos) << results[1].out;
  EXPECT_NE(results[2].out.find("rank 1 of 3"), std::string::npos) << results[2].out;
  EXPECT_NE(results[2].err.find("this spare takes rank 1 from cycle 1"), std::string::npos) << results[2].err;
  EXPECT_NE(results[2].err.find("[node 3 rank 1]"), std::string::npos) << "logs name the slot and the rank: " << results[2].err;
  EXPECT_NE(results[0].err.find("rank 1 moves from node 1"), std::string::npos) << results[0].err;
  EXPECT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out.find("cycle"), std::string::npos) << "the new spare ran a rank: " << again.out;
}

// Xid 79 on node 0's GPU: rank 0 moves to the spare while node 0's launcher keeps serving
// the store and deciding restarts. MASTER_ADDR follows rank 0 (node 0's address was given as
// "localhost", the spare's is what node 0 sees, 127.0.0.1); the spare commits checkpoint-8 as
// the job's checkpoint leader, and the next restart, decided on node 0, resumes from it.
TEST(Spares, RankZeroMovesToTheSpareWhileNodeZeroKeepsTheStoreAndTheCommitsFollowIt) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string latest_is_8 = "for i in $(seq 300); do grep -q checkpoint-8 " + latest + " && break; sleep 0.1; done";
  const std::string report = std::string(kReportResume) + "; echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT " +
                             "MASTER_ADDR=$MASTER_ADDR\"";
  const std::string commands = nlohmann::json::array(
      {"case $BT_RESTART_COUNT in 0) " + Save(4) + " && " + WaitFor(latest) + " && echo started; exec sleep 60;; " +
       "1) " + report + "; " + Save(8) + " && " + latest_is_8 + " && if [ $BT_NODE_RANK = 1 ]; then exit 3; fi; " +
       "exec sleep 60;; *) " + report + ";; esac"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 3);
  settings["health"] = {{"interval_s", 1}};
  settings["spares"] = 1;
  Job job(2, commands, "", true, settings);
  TwoRanksAndASpare launchers(job, scratch, "GPU-zero-1", {{"BT_LEADER_ADDR", "localhost"}});
  auto& processes = launchers.processes;
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 40s)) << processes[0]->Finish().err;
  ASSERT_TRUE(processes[0]->WaitForLog("is a ready spare", 10s)) << processes[0]->Finish().err;
  launchers.XidOnNodeZero();
  auto results = Job::FinishAll(processes);
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(results[size_t(slot)].exit_code, 0) << "node " << slot << ": " << results[size_t(slot)].err;
  }
  const ProcessResult& node0 = results[0];
  const ProcessResult& spare = results[2];
  EXPECT_NE(node0.err.find("rank 0 moves from node 0"), std::string::npos) << node0.err;
  EXPECT_NE(node0.err.find("it keeps serving the rendezvous"), std::string::npos) << node0.err;
  EXPECT_EQ(node0.out.find("cycle 1"), std::string::npos) << "node 0 ran a command after its rank moved: " << node0.out;
  EXPECT_NE(spare.err.find("this spare takes rank 0 from cycle 1"), std::string::npos) << spare.err;
  // Rank 0 resumed from checkpoint-4 on the spare, and MASTER_ADDR named it on both ranks.
  EXPECT_NE(spare.out.find(restart::ResumeReport(1, 4)), std::string::npos) << spare.out << spare.err;
  EXPECT_NE(spare.out.find("rank 0 cycle 1 MASTER_ADDR=127.0.0.1"), std::string::npos) << spare.out;
  EXPECT_NE(results[1].out.find("rank 1 cycle 1 MASTER_ADDR=127.0.0.1"), std::string::npos) << results[1].out;
  // The spare committed checkpoint-8; node 0's next decision resumed every rank from it.
  EXPECT_NE(spare.err.find("committed checkpoint-8"), std::string::npos) << spare.err;
  EXPECT_NE(spare.out.find(restart::ResumeReport(2, 8)), std::string::npos) << spare.out << spare.err;
  EXPECT_NE(results[1].out.find(restart::ResumeReport(2, 8)), std::string::npos) << results[1].out << results[1].err;
  EXPECT_NE(node0.err.find("from checkpoint checkpoint-8"), std::string::npos) << node0.err;
  EXPECT_NE(spare.out.find("rank 0 cycle 2 MASTER_ADDR=127.0.0.1"), std::string::npos) << spare.out;
}

// After rank 0 moved to the spare, node 0 runs nothing but still watches for hangs: a cycle
// in which every rank stops making progress is called hung on node 0 (its report names the
// ranks, not node 0), and the job restarts and finishes.
TEST(Spares, AHangAfterRankZeroMovedIsCalledByNodeZeroAndRestarts) {
  TempDir scratch;
  const std::string commands = nlohmann::json::array(
      {"case $BT_RESTART_COUNT in 0) echo started; exec sleep 60;; 1) echo hanging; exec sleep 60;; "
       "*) echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT ok\";; esac"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 3);
  settings["health"] = {{"interval_s", 1}};
  settings["spares"] = 1;
  settings["watchdog"] = {{"stall_timeout_s", 3}, {"startup_timeout_s", 3}, {"stack_timeout_s", 5}};
  Job job(2, commands, "", false, settings);
  TwoRanksAndASpare launchers(job, scratch, "GPU-hang-1");
  auto& processes = launchers.processes;
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 40s)) << processes[0]->Finish().err;
  launchers.XidOnNodeZero();
  ASSERT_TRUE(processes[0]->WaitForLog("restarting every node in cycle 2", 40s)) << processes[0]->Finish().err;
  auto results = Job::FinishAll(processes);
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(results[size_t(slot)].exit_code, 0) << "node " << slot << ": " << results[size_t(slot)].err;
  }
  EXPECT_NE(results[0].err.find("collecting every node's stacks"), std::string::npos) << results[0].err;
  // Both ranks stall together: either may be named first, never node 0.
  const size_t verdict = results[0].err.find("restart 2/3: cycle 1 failed (node ");
  ASSERT_NE(verdict, std::string::npos) << results[0].err;
  const std::string line = results[0].err.substr(verdict, results[0].err.find('\n', verdict) - verdict);
  EXPECT_NE(line.find(") hung: no progress"), std::string::npos) << "cycle 1 not failed as hung: " << line;
  EXPECT_EQ(line.find("(node 0 ("), std::string::npos) << line;
  // Node 0 sent no stacks of its own (it runs nothing) and waited for both ranks'.
  EXPECT_EQ(results[0].err.find("sent this node's stacks"), std::string::npos) << results[0].err;
  EXPECT_EQ(results[0].err.find("no stacks from node(s)"), std::string::npos) << results[0].err;
  EXPECT_NE(results[2].out.find("rank 0 cycle 2 ok"), std::string::npos) << results[2].out << results[2].err;
  EXPECT_NE(results[1].out.find("rank 1 cycle 2 ok"), std::string::npos) << results[1].out;
}

// Node 0 running no rank still holds the store: a SIGTERM to it (its pod deleted) ends the
// whole job at once, every node stopped with the signal's code, not each one finding the store
// gone after its heartbeat timeout.
TEST(Spares, ASigtermToNodeZeroRunningNoRankStopsTheWholeJobAtOnce) {
  TempDir scratch;
  const std::string commands = Commands("echo started; exec sleep 60", "echo \"rank $BT_NODE_RANK running\"; exec sleep 60");
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["health"] = {{"interval_s", 1}};
  settings["spares"] = 1;
  Job job(2, commands, "", false, settings);
  TwoRanksAndASpare launchers(job, scratch, "GPU-term-1");
  auto& processes = launchers.processes;
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 40s)) << processes[0]->Finish().err;
  launchers.XidOnNodeZero();
  ASSERT_TRUE(processes[2]->WaitForOutput("rank 0 running", 30s)) << processes[2]->Finish().err;
  ASSERT_TRUE(processes[1]->WaitForOutput("rank 1 running", 30s)) << processes[1]->Finish().err;
  const auto term = std::chrono::steady_clock::now();
  processes[0]->Signal(SIGTERM);
  auto results = Job::FinishAll(processes);
  EXPECT_LT(std::chrono::steady_clock::now() - term, 10s);
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(results[size_t(slot)].exit_code, 143) << "node " << slot << ": " << results[size_t(slot)].err;
  }
  EXPECT_NE(results[1].err.find("; running no rank) stopped (it serves the rendezvous)"), std::string::npos) << results[1].err;
}

// Node 0 has an uncorrectable ECC error at the start: rank 0 starts on the spare, whose
// MASTER_ADDR every rank gets; node 0 serves the store, runs nothing, and the job finishes.
TEST(Spares, NodeZeroUnhealthyAtTheStartServesTheStoreWhileRankZeroStartsOnTheSpare) {
  TempDir scratch;
  const std::string commands =
      nlohmann::json::array({"echo \"rank $BT_NODE_RANK MASTER_ADDR=$MASTER_ADDR\"; " + restart::Save(2) +
                             "; sleep 3"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  Job job(2, commands, "", true, settings);
  TwoRanksAndASpare launchers(job, scratch, "GPU-start-1", {{"BT_LEADER_ADDR", "localhost"}}, "gpu 1 ecc_uncorrected 3\n");
  auto results = Job::FinishAll(launchers.processes);
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(results[size_t(slot)].exit_code, 0) << "node " << slot << ": " << results[size_t(slot)].err;
  }
  EXPECT_EQ(results[0].out, "") << "node 0 ran a command: " << results[0].out;
  EXPECT_NE(results[0].err.find("rank 0 starts on a spare, and this node keeps serving the rendezvous"), std::string::npos)
      << results[0].err;
  EXPECT_NE(results[2].out.find("rank 0 MASTER_ADDR=127.0.0.1"), std::string::npos) << results[2].out << results[2].err;
  EXPECT_NE(results[1].out.find("rank 1 MASTER_ADDR=127.0.0.1"), std::string::npos) << results[1].out;
  // The spare commits as rank 0: checkpoint-2 is the job's `latest`.
  EXPECT_NE(results[2].err.find("committed checkpoint-2"), std::string::npos) << results[2].err;
  EXPECT_NE(ReadFile(scratch.path() + "/remote/" + std::string(kJobId) + "/latest").find("checkpoint-2"), std::string::npos);
}

// A retried job whose node 0 cannot train any more: rank 0 starts on the spare from the job's
// committed checkpoint, and node 0's first restart decision (before the spare committed
// anything) resumes every rank from that checkpoint too, not from scratch.
TEST(Spares, ARetryWhoseNodeZeroCannotTrainResumesFromTheJobsCheckpointAtEveryRestart) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  {
    Job first(2, Commands(Save(4) + " && " + WaitFor(latest), "true"), "", true, restart::RestartSettings(scratch, 1));
    auto processes = first.StartAll();
    for (const ProcessResult& result : Job::FinishAll(processes)) ASSERT_EQ(result.exit_code, 0) << result.err;
  }
  const std::string report = std::string(kReportResume) + "; echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT\"";
  const std::string commands = nlohmann::json::array(
      {report + "; if [ $BT_RESTART_COUNT = 0 ] && [ $BT_NODE_RANK = 1 ]; then sleep 0.5; exit 3; fi"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["spares"] = 1;
  Job retry(2, commands, "", true, settings);
  TwoRanksAndASpare launchers(retry, scratch, "GPU-retry-1", {}, "gpu 1 ecc_uncorrected 3\n");
  auto results = Job::FinishAll(launchers.processes);
  for (int slot = 0; slot < 3; ++slot) {
    EXPECT_EQ(results[size_t(slot)].exit_code, 0) << "node " << slot << ": " << results[size_t(slot)].err;
  }
  EXPECT_EQ(results[0].out, "") << "node 0 ran a command: " << results[0].out;
  EXPECT_NE(results[0].err.find("from checkpoint checkpoint-4"), std::string::npos) << results[0].err;
  for (int slot : {1, 2}) {
    EXPECT_NE(results[size_t(slot)].out.find(restart::ResumeReport(1, 4)), std::string::npos)
        << "node " << slot << ": " << results[size_t(slot)].out << results[size_t(slot)].err;
  }
  EXPECT_NE(results[2].out.find("rank 0 cycle 1"), std::string::npos) << results[2].out;
}

// A node whose job fails every cycle though its health reads fine: it restarts in place
// until it has failed launcher.restart.max_failures_per_node cycles, then its rank moves to
// the spare and it leaves (75).
TEST(Spares, ANodeFailingEveryCycleIsExcludedAfterMaxFailuresPerNode) {
  TempDir scratch;
  const std::string commands = nlohmann::json::array(
      {"if [ -n \"$BAD_NODE\" ]; then sleep 0.3; exit 3; fi; echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT ok\"; "
       "sleep 1"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 3);
  settings["restart"]["max_failures_per_node"] = 2;
  settings["spares"] = 1;
  Job job(2, commands, "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 3; ++slot) {
    std::map<std::string, std::string> env;
    if (slot == 1) env["BAD_NODE"] = "1";
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3, env)));
  }
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 75) << results[1].err;
  EXPECT_NE(results[1].err.find("rank 1 moved to the spare node 2: it failed 2 cycles"), std::string::npos)
      << results[1].err;
  EXPECT_EQ(results[0].exit_code, 0) << results[0].err;
  EXPECT_EQ(results[2].exit_code, 0) << results[2].err;
  EXPECT_NE(results[0].out.find("rank 0 cycle 2 ok"), std::string::npos) << results[0].out;
  EXPECT_NE(results[2].out.find("rank 1 cycle 2 ok"), std::string::npos) << results[2].out << results[2].err;
  EXPECT_EQ(results[2].out.find("cycle 0"), std::string::npos) << "the spare ran before it was promoted";
}

// A node's launcher lost (SIGKILL) while a spare waits: the spare takes its rank in the
// restart at once, nobody waits rejoin_timeout_s (60 s) for a replacement.
TEST(Spares, ALostNodesRankGoesToTheSpareWithoutWaitingForAReplacement) {
  TempDir scratch;
  const std::string commands = Commands("echo started; exec sleep 60", "echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT ok\"");
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["spares"] = 1;
  Job job(2, commands, "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 3; ++slot) processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3)));
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 40s)) << processes[1]->Finish().err;
  ASSERT_TRUE(processes[0]->WaitForOutput("started", 10s)) << processes[0]->Finish().err;  // the run is marked started
  ASSERT_TRUE(processes[0]->WaitForLog("is a ready spare", 10s)) << processes[0]->Finish().err;
  const auto killed = std::chrono::steady_clock::now();
  processes[1]->Signal(SIGKILL);
  processes[1]->Finish();
  ProcessResult leader = processes[0]->Finish();
  ProcessResult spare = processes[2]->Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 20s);
  EXPECT_EQ(leader.exit_code, 0) << leader.err;
  EXPECT_EQ(spare.exit_code, 0) << spare.err;
  EXPECT_NE(spare.out.find("rank 1 cycle 1 ok"), std::string::npos) << spare.out << spare.err;
  EXPECT_NE(leader.err.find("rank 1 moves from node 1"), std::string::npos) << leader.err;
}

// A spare killed while it waits is logged; the job goes on and ends as it would have.
TEST(Spares, ASpareKilledWhileWaitingIsLoggedAndTheJobGoesOn) {
  TempDir scratch;
  const std::string go_on = scratch.path() + "/go-on";
  const std::string commands = nlohmann::json::array({"echo started; " + WaitFor(go_on) + "; echo done"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["spares"] = 1;
  Job job(2, commands, "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 3; ++slot) processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3)));
  ASSERT_TRUE(processes[0]->WaitForLog("is a ready spare", 40s)) << processes[0]->Finish().err;
  processes[2]->Signal(SIGKILL);
  processes[2]->Finish();
  ASSERT_TRUE(processes[0]->WaitForLog("the spare node 2", 15s));
  WriteFile(go_on, "1");
  ProcessResult leader = processes[0]->Finish();
  ProcessResult follower = processes[1]->Finish();
  EXPECT_EQ(leader.exit_code, 0) << leader.err;
  EXPECT_EQ(follower.exit_code, 0) << follower.err;
  EXPECT_NE(leader.err.find("is gone"), std::string::npos) << leader.err;
}

// Uncorrectable ECC on node 2 at the start, with a spare: node 0's table names it before any
// command runs, rank 2 starts on the spare (slot 3), and node 2 runs nothing and leaves (75)
// once every node is ready; the job finishes on the others and the spare.
TEST(Spares, AnUnhealthyNodeAtTheStartGivesItsRankToTheSpareBeforeAnyCommandRuns) {
  TempDir scratch;
  const std::string ran = scratch.path() + "/ran-";
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  Job job(3, "[\"echo $BT_NODE_RANK > " + ran + "$(cat /proc/sys/kernel/random/uuid)\"]", "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 4; ++slot) {
    const std::string state = scratch.path() + "/nvml-" + std::to_string(slot);
    WriteNvmlState(state, "gpus 2\ngpu 1 uuid GPU-node" + std::to_string(slot) + "-1\n" +
                              (slot == 2 ? "gpu 1 ecc_uncorrected 3\n" : ""));
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 4, FakeNvml(state))));
  }
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[2].exit_code, 75) << results[2].err;
  EXPECT_NE(results[2].err.find("this node cannot train; it runs no rank"), std::string::npos) << results[2].err;
  for (int slot : {0, 1, 3}) EXPECT_EQ(results[size_t(slot)].exit_code, 0) << "node " << slot << ": " << results[size_t(slot)].err;
  const std::string& leader = results[0].err;
  const size_t table = leader.find("a node cannot train (launcher.health)");
  ASSERT_NE(table, std::string::npos) << leader;
  EXPECT_NE(leader.find("GPU-node2-1", table), std::string::npos) << leader;
  EXPECT_NE(leader.find("its rank 2 starts on the spare node 3"), std::string::npos) << leader;
  // Ranks 0, 1 and 2 ran once each; node 2 ran nothing.
  std::multiset<std::string> ranks;
  for (const auto& entry : fs::directory_iterator(scratch.path())) {
    if (entry.path().filename().string().starts_with("ran-")) ranks.insert(ReadFile(entry.path().string()));
  }
  EXPECT_EQ(ranks, (std::multiset<std::string>{"0\n", "1\n", "2\n"}));
  EXPECT_NE(results[3].err.find("[node 3 rank 2]"), std::string::npos) << results[3].err;
}

// Two nodes lose a GPU, one after the other, with one spare: the first's rank goes to the
// spare, the second's waits for a launcher in its slot (a replaced pod), which joins and runs
// it; the job finishes.
TEST(Spares, TwoNodesLeavingWithOneSpareTheSecondWaitsForALauncherInItsSlot) {
  TempDir scratch;
  const std::string go_on = scratch.path() + "/go-on";
  const std::string commands = Commands("echo started; exec sleep 60", "echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT ok\"; " +
                                                                         WaitFor(go_on));
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["spares"] = 1;
  settings["health"] = {{"interval_s", 1}};
  Job job(3, commands, "", false, settings);
  std::vector<std::string> states;
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 4; ++slot) {
    states.push_back(scratch.path() + "/nvml-" + std::to_string(slot));
    WriteNvmlState(states.back(), "gpus 4\n");
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 4, FakeNvml(states.back()))));
  }
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 40s)) << processes[1]->Finish().err;
  ASSERT_TRUE(processes[0]->WaitForLog("is a ready spare", 10s)) << processes[0]->Finish().err;
  WriteNvmlState(states[1], "gpus 4\nxid 1 0 79\n");
  EXPECT_EQ(processes[1]->Finish().exit_code, 75);
  ASSERT_TRUE(processes[3]->WaitForOutput("rank 1 cycle 1 ok", 20s)) << processes[3]->Finish().err;
  WriteNvmlState(states[2], "gpus 4\nxid 1 0 79\n");  // no spare left
  EXPECT_EQ(processes[2]->Finish().exit_code, 75);
  ASSERT_TRUE(processes[0]->WaitForLog("no spare is ready: its rank waits for a launcher in its slot", 20s))
      << processes[0]->Finish().err;
  const std::string healthy = scratch.path() + "/nvml-replacement";
  WriteNvmlState(healthy, "gpus 4\n");
  LauncherProcess replacement(SpareJobSpec(job, 2, 4, FakeNvml(healthy)));
  ASSERT_TRUE(replacement.WaitForOutput("rank 2 cycle 2 ok", 30s)) << replacement.Finish().err;
  WriteFile(go_on, "1");
  ProcessResult replaced = replacement.Finish();
  ProcessResult leader = processes[0]->Finish();
  ProcessResult spare = processes[3]->Finish();
  EXPECT_EQ(leader.exit_code, 0) << leader.err;
  EXPECT_EQ(spare.exit_code, 0) << spare.err;
  EXPECT_EQ(replaced.exit_code, 0) << replaced.err;
  EXPECT_NE(spare.out.find("rank 1 cycle 2 ok"), std::string::npos) << spare.out << spare.err;
}

// Review of spares, D1: a spare runs no job, so it never answers a stack request: node 0
// waited 2 x stack_timeout_s + 10 s for it at every hang, and blamed it for sending none.
TEST(Spares, AHangIsDeclaredWithoutWaitingForTheSparesStacks) {
  TempDir scratch;
  const std::string commands = Commands("echo started; exec sleep 60", "echo \"rank $BT_NODE_RANK cycle $BT_RESTART_COUNT ok\"");
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  settings["watchdog"] = {{"stall_timeout_s", 3}, {"startup_timeout_s", 3}, {"stack_timeout_s", 5}};
  Job job(2, commands, "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 3; ++slot) processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3)));
  ASSERT_TRUE(processes[0]->WaitForLog("collecting every node's stacks", 40s)) << processes[0]->Finish().err;
  const auto collecting = std::chrono::steady_clock::now();
  ASSERT_TRUE(processes[0]->WaitForLog("restarting every node in cycle 1", 30s)) << processes[0]->Finish().err;
  EXPECT_LT(std::chrono::steady_clock::now() - collecting, 8s);
  std::vector<ProcessResult> results;
  for (auto& process : processes) results.push_back(process->Finish());
  EXPECT_EQ(results[0].err.find("no stacks from node(s) 2"), std::string::npos) << results[0].err;
  for (const ProcessResult& result : results) EXPECT_EQ(result.exit_code, 0) << result.err;
}

// Review of spares, D3: 75 says "replace this node"; a job that ends because of it (no
// restart left) ends 69 on every other node, never 75 (a podFailurePolicy that ignores 75
// would recreate every pod forever).
TEST(Spares, OnlyTheNodeThatCannotTrainExits75WhenTheJobEndsOnIt) {
  TempDir scratch;
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  settings["health"] = {{"interval_s", 1}};
  const std::string commands = Commands("if [ -n \"$BAD_NODE\" ]; then sleep 0.3; exit 3; fi; exec sleep 60",
                                        "echo started; exec sleep 60");
  Job job(2, commands, "", false, settings);
  std::vector<std::string> states;
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 3; ++slot) {
    states.push_back(scratch.path() + "/nvml-" + std::to_string(slot));
    WriteNvmlState(states.back(), "gpus 4\n");
    std::map<std::string, std::string> env = FakeNvml(states.back());
    if (slot == 1) env["BAD_NODE"] = "1";
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3, env)));
  }
  ASSERT_TRUE(processes[1]->WaitForOutput("started", 40s)) << processes[1]->Finish().err;
  WriteNvmlState(states[1], "gpus 4\nxid 1 3 79\n");  // the one restart is spent: the job ends
  std::vector<ProcessResult> results;
  for (auto& process : processes) results.push_back(process->Finish());
  EXPECT_EQ(results[1].exit_code, 75) << results[1].err;
  EXPECT_EQ(results[0].exit_code, 69) << results[0].err;
  EXPECT_EQ(results[2].exit_code, 69) << results[2].err;
}

// Review 8, N5: a retried job (every launcher started again) whose rank 1 starts on the spare
// because node 1 cannot train: the spare loads rank 1's part of `latest`, not its slot's
// (there is none), and resumes rank 1 from it.
TEST(Spares, ASpareGivenARankAtTheStartOfARetryLoadsThatRanksPart) {
  TempDir scratch;
  const std::string latest = scratch.path() + "/remote/" + kJobId + "/latest";
  const std::string commands = nlohmann::json::array(
      {"if [ -n \"$BT_RESUME_CHECKPOINT\" ]; then echo \"rank $BT_NODE_RANK resumed $(cat "
       "$BT_LOAD_CHECKPOINT_DIR/rank-$BT_NODE_RANK/$BT_RESUME_CHECKPOINT/trainer_state.json)\"; else " + Save(4) +
       " && " + WaitFor(latest) + "; fi"}).dump();
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  Job job(2, commands, "", true, settings);
  auto run = [&](const std::string& bad_slot_state) {
    std::vector<std::unique_ptr<LauncherProcess>> processes;
    for (int slot = 0; slot < 3; ++slot) {
      const std::string state = scratch.path() + "/nvml-" + std::to_string(slot);
      WriteNvmlState(state, "gpus 2\n" + std::string(slot == 1 ? bad_slot_state : ""));
      processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 3, FakeNvml(state))));
    }
    return Job::FinishAll(processes);
  };
  auto first = run("");
  ASSERT_EQ(first[0].exit_code, 0) << first[0].err;
  ASSERT_EQ(ReadFile(latest), "checkpoint-4\n");
  auto retry = run("gpu 1 ecc_uncorrected 3\n");
  EXPECT_EQ(retry[1].exit_code, 75) << retry[1].err;
  EXPECT_EQ(retry[0].exit_code, 0) << retry[0].err;
  EXPECT_EQ(retry[2].exit_code, 0) << retry[2].err;
  EXPECT_NE(retry[0].out.find("rank 0 resumed {\"global_step\": 4}"), std::string::npos) << retry[0].out << retry[0].err;
  EXPECT_NE(retry[2].out.find("rank 1 resumed {\"global_step\": 4}"), std::string::npos) << retry[2].out << retry[2].err;
}

// Review 8, N1: two nodes cannot train at the start and one spare: rank 1 starts on the spare,
// rank 2 has none and the start fails. Both unhealthy nodes exit 75 (replace them); the
// others 69.
TEST(Spares, EveryNodeThatCannotTrainExits75WhenTheStartFails) {
  TempDir scratch;
  nlohmann::json settings = restart::RestartSettings(scratch, 1);
  settings["spares"] = 1;
  Job job(3, R"(["echo ran"])", "", false, settings);
  std::vector<std::unique_ptr<LauncherProcess>> processes;
  for (int slot = 0; slot < 4; ++slot) {
    const std::string state = scratch.path() + "/nvml-" + std::to_string(slot);
    WriteNvmlState(state, std::string("gpus 2\n") + (slot == 1 || slot == 2 ? "gpu 1 ecc_uncorrected 3\n" : ""));
    processes.push_back(std::make_unique<LauncherProcess>(SpareJobSpec(job, slot, 4, FakeNvml(state))));
  }
  auto results = Job::FinishAll(processes);
  EXPECT_EQ(results[1].exit_code, 75) << results[1].err;
  EXPECT_EQ(results[2].exit_code, 75) << results[2].err;
  EXPECT_EQ(results[0].exit_code, 69) << results[0].err;
  EXPECT_EQ(results[3].exit_code, 69) << results[3].err;
  for (const ProcessResult& result : results) EXPECT_EQ(result.out.find("ran"), std::string::npos) << result.out;
}

// The count every launcher is given must be node_count + spares: a launcher counting only
// the training nodes fails at once, naming both settings.
TEST(Spares, ACountWithoutTheSparesIsAConfigErrorNamingBoth) {
  TempDir scratch;
  nlohmann::json settings = restart::RestartSettings(scratch, 2);
  settings["spares"] = 1;
  Job job(2, R"(["true"])", "", false, settings);
  LauncherProcess launcher(job.Spec(0));  // BT_GROUP_SIZE=2
  ProcessResult result = launcher.Finish();
  EXPECT_EQ(result.exit_code, 65) << result.err;
  EXPECT_NE(result.err.find("compute.node_count 2 + launcher.spares 1 = 3 launchers"), std::string::npos) << result.err;
}

}  // namespace spares

namespace goodput {

// The trainer of the goodput test: a step a second, a checkpoint each step, each line with
// the time (this host's clock: the test compares differences only). Cycle 0: node 2 fails
// 0.3 s after `latest` ($LATEST) names checkpoint-4 (a save whose commit has not begun when
// the job restarts is never committed: on a busy machine that took longer than a fixed
// wait). Cycle 1: after saving checkpoint-7 every node prints for
// 2 s more, then hangs. Cycle 2 finishes at step 10.
constexpr const char* kTrainer = R"sh(now() { date +%s.%N; }
start=0
[ -n "$BT_RESUME_CHECKPOINT" ] && start=${BT_RESUME_CHECKPOINT#checkpoint-}
for step in $(seq $((start + 1)) 10); do
  sleep 1
  d=$BT_CHECKPOINT_DIR/checkpoint-$step
  mkdir -p $d && echo x > $d/model.bin && echo "{\"global_step\": $step}" > $d/trainer_state.json
  echo "saved checkpoint-$step at $(now) in cycle $BT_RESTART_COUNT"
  if [ "$BT_RESTART_COUNT" = 0 ] && [ $step = 4 ] && [ $BT_NODE_RANK = 2 ]; then
    for i in $(seq 600); do grep -q checkpoint-4 "$LATEST" 2>/dev/null && break; sleep 0.05; done
    sleep 0.3; echo "failing at $(now)"; exit 1
  fi
  if [ "$BT_RESTART_COUNT" = 1 ] && [ $step = 7 ]; then
    for i in 1 2 3 4; do sleep 0.5; echo "still working at $(now)"; done
    exec sleep 1000
  fi
done
)sh";

// The report opened in Debian's chromium (headless): no script error, a lane for each of
// `lanes` and `faults` faults in the page it rendered; its screenshot is kept in the test's
// output (test-output/ under the build's tests folder). SKIPPED without chromium.
void OpenInChromium(const std::string& html, const std::set<std::string>& lanes, size_t faults) {
  if (access("/usr/bin/chromium", X_OK) != 0) {
    GTEST_SKIP() << "Debian's chromium is not installed (apt-get install chromium): the report is not opened in a browser";
  }
  TempDir profile;
  const std::string flags = " --headless --no-sandbox --disable-gpu --user-data-dir=" + profile.path() + " ";
  const std::string dom_path = profile.path() + "/dom.html";
  const int dumped = std::system(("timeout 60 /usr/bin/chromium" + flags + "--enable-logging=stderr --dump-dom file://" +
                                  html + " > " + dom_path + " 2> " + profile.path() + "/chromium.log").c_str());
  ASSERT_TRUE(WIFEXITED(dumped) && WEXITSTATUS(dumped) == 0) << ReadFile(profile.path() + "/chromium.log");
  const std::string log = ReadFile(profile.path() + "/chromium.log");
  EXPECT_EQ(log.find("Uncaught"), std::string::npos) << log;
  const std::string dom = ReadFile(dom_path);
  for (const std::string& lane : lanes) {
    EXPECT_NE(dom.find("data-nodes=\"" + lane + "\""), std::string::npos) << "no lane for node " << lane;
  }
  size_t drawn = 0;
  for (size_t at = dom.find("<g class=\"fault "); at != std::string::npos; at = dom.find("<g class=\"fault ", at + 1)) ++drawn;
  EXPECT_EQ(drawn, faults);
  fs::create_directories("test-output");
  const std::string shot = fs::absolute("test-output/goodput-report.png").string();
  const int shot_status = std::system(("timeout 60 /usr/bin/chromium" + flags + "--window-size=1400,900 --screenshot=" + shot +
                                       " file://" + html + " > /dev/null 2>&1").c_str());
  EXPECT_TRUE(WIFEXITED(shot_status) && WEXITSTATUS(shot_status) == 0);
  EXPECT_GT(fs::file_size(shot), 10'000u);
}

// The last time `prefix` starts a line of `output` with ("<prefix><seconds>...").
double TimeAfter(const std::string& output, const std::string& prefix) {
  double found = NAN;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    const size_t at = line.find(prefix);
    if (at != std::string::npos) found = std::stod(line.substr(at + prefix.size()));
  }
  return found;
}

// Issue 31 §4: a 3-node job with one failure and one hang, restarts on, a checkpoint every
// second. Node 0's goodput.json adds up to the wall time, the failure's lost work is the
// time from the save it resumed from to the fault, the hang's bucket is the stall until it
// was called, every node has a lane, and the report is beside the checkpoints.
TEST(Goodput, AFailureAndAHangAreChargedToLostWorkAndTheHangBucket) {
  TempDir scratch;
  const std::string trainer =
      scratch.Write("train.sh", "LATEST=" + scratch.path() + "/remote/" + restart::kJobId + "/latest\n" + kTrainer);
  nlohmann::json launcher = restart::RestartSettings(scratch, 3, 2);
  launcher["watchdog"] = {{"stall_timeout_s", 3}, {"stack_timeout_s", 2}, {"report_dir", scratch.path() + "/reports"}};
  launcher["checkpoint"]["quiet_period_s"] = 0.3;
  launcher["checkpoint"]["scan_interval_s"] = 0.2;
  Job job(3, nlohmann::json::array({"sh " + trainer}).dump(), "", true, launcher, FreePort());
  auto processes = job.StartAll();
  auto results = Job::FinishAll(processes);
  for (int rank = 0; rank < 3; ++rank) ASSERT_EQ(results[rank].exit_code, 0) << "node " << rank << ":\n" << results[rank].err;

  const std::string json_path = scratch.path() + "/reports/goodput.json";
  ASSERT_TRUE(fs::exists(json_path)) << results[0].err;
  const nlohmann::json goodput = nlohmann::json::parse(ReadFile(json_path));
  double buckets = goodput["goodput_s"].get<double>();
  for (const auto& [cause, seconds] : goodput["badput_s"].items()) buckets += seconds.get<double>();
  EXPECT_NEAR(buckets, goodput["wall_s"].get<double>(), 0.01 * goodput["wall_s"].get<double>());
  ASSERT_EQ(goodput["cycles"].size(), 3u) << goodput.dump(1);
  const nlohmann::json& failed = goodput["cycles"][0];
  const nlohmann::json& hung = goodput["cycles"][1];
  EXPECT_EQ(failed["cause"], "failure");
  EXPECT_EQ(failed["node"], 2);
  EXPECT_EQ(failed["kept"], "checkpoint-4");
  EXPECT_EQ(hung["cause"], "hang");
  EXPECT_EQ(hung["kept"], "checkpoint-7");
  EXPECT_EQ(goodput["cycles"][2]["cause"], "success");

  // Lost work: node 0's save of checkpoint-4 (its part is what the record's time is) to node
  // 2's failure; then node 0's save of checkpoint-7 to the job's last progress.
  const double saved_4 = TimeAfter(results[0].out.substr(0, results[0].out.find("in cycle 1")), "saved checkpoint-4 at ");
  const double failed_at = TimeAfter(results[2].out, "failing at ");
  // Node 0 dates the fault when the restart reaches it: after node 2's exit, its report and
  // the decision, which a busy machine delays.
  EXPECT_NEAR(failed["lost_work_s"].get<double>(), failed_at - saved_4, 0.5) << results[0].out << results[2].out;
  double last_progress = 0;
  for (const ProcessResult& result : results) last_progress = std::max(last_progress, TimeAfter(result.out, "still working at "));
  const double saved_7 = TimeAfter(results[0].out, "saved checkpoint-7 at ");
  EXPECT_NEAR(hung["lost_work_s"].get<double>(), last_progress - saved_7, 0.3) << results[0].out;
  // The hang: the stall (stall_timeout_s) and its detection (the stacks, at most twice
  // stack_timeout_s), charged from the last progress.
  EXPECT_GE(hung["hang_s"].get<double>(), 3.0);
  EXPECT_LE(hung["hang_s"].get<double>(), 3.0 + 2 * 2 + 1.0);
  EXPECT_NEAR(hung["hang_s"].get<double>(), hung["detected_s"].get<double>() - hung["stall_start_s"].get<double>(), 1e-3);

  std::set<int> lanes;
  for (const auto& lane : goodput["lanes"]) lanes.insert(lane["node"].get<int>());
  EXPECT_EQ(lanes, (std::set<int>{0, 1, 2}));
  EXPECT_NE(results[0].err.find("goodput:\n"), std::string::npos);
  EXPECT_NE(results[0].err.find("report: " + scratch.path() + "/reports/report.html"), std::string::npos);
  const std::string uploaded = scratch.path() + "/remote/" + restart::kJobId + "/.bt-report/";
  EXPECT_EQ(ReadFile(uploaded + "goodput.json"), ReadFile(json_path));
  EXPECT_TRUE(fs::exists(uploaded + "report.html"));

  // What a user does the morning after: the page from the destination, opened in a browser.
  const std::string html = scratch.path() + "/job.html";
  ProcessResult report = RunLauncher({{"report", "--destination", "file://" + scratch.path() + "/remote", "--job-id",
                                       restart::kJobId, "--out", html, "--root", scratch.path() + "/report-root"}});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  OpenInChromium(html, {"0", "1", "2"}, 2);
}

// Issue 31 §1, steps: a job of 3 nodes printing "global_step=N" (launcher.progress.step_pattern),
// node 2 taking 0.9 s a step where the others take 0.5 s: the steps done, the step time and
// node 2 named a straggler. No heartbeat file: the output is the only step source.
TEST(Goodput, StepsReadFromTheOutputNameTheSlowNodeAStraggler) {
  TempDir scratch;
  const std::string trainer = scratch.Write(
      "train.sh", "for step in $(seq 1 8); do if [ $BT_NODE_RANK = 2 ]; then sleep 0.9; else sleep 0.5; fi; "
                  "echo \"train: global_step=$step loss 0.5\"; done");
  nlohmann::json launcher = {{"watchdog", {{"report_dir", scratch.path() + "/reports"}}},
                             {"progress", {{"step_pattern", "global_step=(\\d+)"}}}};
  Job job(3, nlohmann::json::array({"sh " + trainer}).dump(), "", false, launcher, FreePort());
  auto processes = job.StartAll();
  for (auto& result : Job::FinishAll(processes)) ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json goodput = nlohmann::json::parse(ReadFile(scratch.path() + "/reports/goodput.json"));
  const nlohmann::json& steps = goodput["steps"];
  ASSERT_TRUE(steps.is_object()) << goodput.dump(1);
  EXPECT_EQ(steps["steps_done"], 7);
  EXPECT_EQ(steps["steps_redone"], 0);
  EXPECT_NEAR(steps["step_p50_s"].get<double>(), 0.5, 0.15) << steps.dump();
  EXPECT_EQ(steps["straggler_node"], 2) << steps.dump();
  EXPECT_NEAR(steps["straggler_ratio"].get<double>(), 1.8, 0.4) << steps.dump();
  // The job ended when node 2's training did, not node 0's: its last seconds are goodput.
  EXPECT_LT(goodput["badput_s"]["drain"].get<double>(), 1.0) << goodput.dump(1);
}

// The same from BT_HEARTBEAT_FILE ({"step": N}), which the watch reads once a second at the
// time the file was written: node 1 (1 s a step) is the straggler against node 0 (0.5 s).
TEST(Goodput, StepsReadFromTheHeartbeatFileNameTheSlowNodeAStraggler) {
  TempDir scratch;
  const std::string trainer = scratch.Write(
      "train.sh", "for step in $(seq 1 10); do if [ $BT_NODE_RANK = 1 ]; then sleep 1; else sleep 0.5; fi; "
                  "echo \"{\\\"step\\\": $step}\" > $BT_HEARTBEAT_FILE; done");
  nlohmann::json launcher = {{"watchdog", {{"report_dir", scratch.path() + "/reports"}}}};
  Job job(2, nlohmann::json::array({"sh " + trainer}).dump(), "", false, launcher, FreePort());
  auto processes = job.StartAll();
  for (auto& result : Job::FinishAll(processes)) ASSERT_EQ(result.exit_code, 0) << result.err;
  const nlohmann::json goodput = nlohmann::json::parse(ReadFile(scratch.path() + "/reports/goodput.json"));
  const nlohmann::json& steps = goodput["steps"];
  ASSERT_TRUE(steps.is_object()) << goodput.dump(1);
  EXPECT_GE(steps["steps_done"].get<int>(), 7) << steps.dump();
  EXPECT_EQ(steps["straggler_node"], 1) << steps.dump();
  for (const auto& node : steps["nodes"]) {
    EXPECT_NEAR(node["median_s"].get<double>(), node["node"] == 1 ? 1.0 : 0.5, 0.2) << steps.dump();
  }
}

// Issue 31 §2: live metrics.

// GET http://127.0.0.1:<port><path>: the body, "" when the server does not answer.
std::string HttpGet(uint16_t port, const std::string& path) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    close(fd);
    return "";
  }
  const std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  if (write(fd, request.data(), request.size()) != ssize_t(request.size())) {
    close(fd);
    return "";
  }
  std::string response;
  char buffer[8192];
  for (ssize_t got; (got = read(fd, buffer, sizeof buffer)) > 0;) response.append(buffer, size_t(got));
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// How many times `text` appears in `log`.
size_t Occurrences(const std::string& log, const std::string& text) {
  size_t count = 0;
  for (size_t at = log.find(text); at != std::string::npos; at = log.find(text, at + 1)) ++count;
  return count;
}

// A sample of Prometheus text: `series` is the name with its labels as served.
std::optional<double> SampleValue(const std::string& text, const std::string& name, const std::string& label = "") {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (!line.starts_with(name + "{") || line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return std::nullopt;
}

// The value Prometheus has for `query` on `node` now (its HTTP API), nullopt when none.
std::optional<double> PrometheusValue(uint16_t port, const std::string& query, int node) {
  const std::string body = HttpGet(port, "/api/v1/query?query=" + query);
  const nlohmann::json answer = nlohmann::json::parse(body, nullptr, false);
  if (!answer.is_object() || answer.value("status", "") != "success") return std::nullopt;
  for (const auto& series : answer["data"]["result"]) {
    if (series["metric"].value("node", "") != std::to_string(node)) continue;
    return std::stod(series["value"][1].get<std::string>());
  }
  return std::nullopt;
}

// Each node saves a checkpoint every 0.5 s up to checkpoint-4; node 1 fails once after
// checkpoint-2; then every node waits for the test's stop file.
constexpr const char* kMetricsTrainer = R"sh(start=0
[ -n "$BT_RESUME_CHECKPOINT" ] && start=${BT_RESUME_CHECKPOINT#checkpoint-}
for step in $(seq $((start + 1)) 4); do
  sleep 0.5
  d=$BT_CHECKPOINT_DIR/checkpoint-$step
  mkdir -p $d && echo x > $d/model.bin && echo "{\"global_step\": $step}" > $d/trainer_state.json
  if [ "$BT_RESTART_COUNT" = 0 ] && [ $step = 2 ] && [ $BT_NODE_RANK = 1 ]; then sleep 0.5; exit 1; fi
done
echo "saved everything in cycle $BT_RESTART_COUNT"
while [ ! -e "$STOP_FILE" ]; do sleep 0.1; done
)sh";

// A real Prometheus (Debian's) scrapes both nodes of a job with one restart while it runs:
// its HTTP API answers the restarts used and the checkpoints committed the launchers' own
// logs show, and node 0's /metrics adds up (goodput + badput + uncommitted = wall time).
TEST(Metrics, APrometheusServerScrapesBothNodesAndGetsTheJobsRestartsAndCommits) {
  if (access("/usr/bin/prometheus", X_OK) != 0) {
    GTEST_SKIP() << "Debian's prometheus is not installed (apt-get install prometheus): no server to scrape the nodes";
  }
  TempDir scratch;
  const uint16_t metrics_ports[2] = {FreePort(), FreePort()};
  const uint16_t prometheus_port = FreePort();
  const std::string config = scratch.Write("prometheus.yml",
      "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: bt-launch\n"
      "    static_configs:\n      - targets: ['127.0.0.1:" + std::to_string(metrics_ports[0]) + "', '127.0.0.1:" +
      std::to_string(metrics_ports[1]) + "']\n");
  LaunchSpec server_spec;
  server_spec.args = {"--config.file=" + config, "--storage.tsdb.path=" + scratch.path() + "/tsdb",
                      "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port)};
  server_spec.timeout = 120s;
  LauncherProcess prometheus(server_spec, "/usr/bin/prometheus");

  const std::string trainer = scratch.Write("train.sh", kMetricsTrainer);
  const std::string stop_file = scratch.path() + "/stop";
  nlohmann::json launcher = restart::RestartSettings(scratch, 2);
  launcher["checkpoint"]["quiet_period_s"] = 0.3;
  launcher["checkpoint"]["scan_interval_s"] = 0.2;
  Job job(2, nlohmann::json::array({"sh " + trainer}).dump(), "", true, launcher, FreePort());
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    LaunchSpec spec = job.Spec(rank, {}, {{"BT_METRICS_PORT", std::to_string(metrics_ports[rank])}, {"STOP_FILE", stop_file}});
    spec.timeout = 90s;
    nodes.push_back(std::make_unique<LauncherProcess>(spec));
  }
  for (auto& node : nodes) ASSERT_TRUE(node->WaitForOutput("saved everything in cycle 1", 45s)) << node->Finish().err;
  ASSERT_TRUE(nodes[0]->WaitForLog("committed checkpoint-4", 20s)) << nodes[0]->Finish().err;

  // The job's commits as node 0 logged them, each once; none comes after checkpoint-4's.
  // Prometheus scrapes once a second and node 0 publishes once a second: its answers
  // catch up with the log within a few.
  const size_t logged = Occurrences(nodes[0]->LogSoFar(), "latest names it");
  std::optional<double> restarts[2];
  std::optional<double> committed;
  for (auto deadline = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < deadline;) {
    for (int rank = 0; rank < 2; ++rank) restarts[rank] = PrometheusValue(prometheus_port, "bt_launch_restarts_used", rank);
    committed = PrometheusValue(prometheus_port, "bt_launch_job_checkpoints_committed_total", 0);
    if (restarts[0] == 1.0 && restarts[1] == 1.0 && committed == double(logged)) break;
    std::this_thread::sleep_for(500ms);
  }
  const std::string live = HttpGet(metrics_ports[0], "/metrics");
  WriteFile(stop_file);
  const ProcessResult leader = nodes[0]->Finish();
  const ProcessResult follower = nodes[1]->Finish();
  ASSERT_EQ(leader.exit_code, 0) << leader.err;
  ASSERT_EQ(follower.exit_code, 0) << follower.err;
  EXPECT_EQ(restarts[0], 1.0) << leader.err;
  EXPECT_EQ(restarts[1], 1.0) << follower.err;
  EXPECT_EQ(Occurrences(leader.err, "latest names it"), logged) << leader.err;
  ASSERT_TRUE(committed.has_value()) << live;
  EXPECT_EQ(*committed, double(logged)) << leader.err;

  // One snapshot of node 0: every second of the job so far in exactly one place.
  const auto wall = SampleValue(live, "bt_launch_wall_seconds");
  const auto goodput = SampleValue(live, "bt_launch_goodput_seconds");
  const auto uncommitted = SampleValue(live, "bt_launch_uncommitted_seconds");
  ASSERT_TRUE(wall && goodput && uncommitted) << live;
  double buckets = *goodput + *uncommitted;
  for (const char* cause : {"prepare", "restart", "lost_work", "hang", "drain"}) {
    const auto seconds = SampleValue(live, "bt_launch_badput_seconds", "cause=\"" + std::string(cause) + "\"");
    ASSERT_TRUE(seconds.has_value()) << cause << "\n" << live;
    buckets += *seconds;
  }
  EXPECT_NEAR(buckets, *wall, 0.01 * *wall) << live;
  EXPECT_GT(*goodput, 0.5) << live;
  EXPECT_GT(*SampleValue(live, "bt_launch_badput_seconds", "cause=\"restart\""), 0) << live;
  EXPECT_EQ(SampleValue(live, "bt_launch_nodes", "state=\"ready\""), 2.0) << live;
  EXPECT_EQ(SampleValue(live, "bt_launch_phase", "phase=\"run\""), 1.0) << live;
  EXPECT_EQ(SampleValue(live, "bt_launch_cycle"), 1.0) << live;
  EXPECT_GE(SampleValue(live, "bt_launch_checkpoints_committed_total").value_or(0), 2.0) << live;
  EXPECT_GT(SampleValue(live, "bt_launch_upload_bytes_total").value_or(0), 0.0) << live;
  // Labels are the node's own and a fixed set of values: never a checkpoint's name.
  EXPECT_EQ(live.find("checkpoint-"), std::string::npos) << live;
}

// A port that is taken: the job runs without metrics, and the log says why.
TEST(Metrics, APortInUseIsLoggedAndTheJobRunsWithoutMetrics) {
  const int taken = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  uint16_t port = 0;
  for (int attempt = 0; attempt < 20; ++attempt) {
    port = FreePort();
    address.sin_port = htons(port);
    if (bind(taken, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) break;
  }
  ASSERT_EQ(listen(taken, 1), 0);
  TempDir scratch;
  LaunchSpec spec;
  spec.args = {"run", "--root", scratch.path(), "--", "sh", "-c", "sleep 1; echo ran"};
  spec.set_env = {{"BT_METRICS_PORT", std::to_string(port)}};
  const ProcessResult result = RunLauncher(spec);
  close(taken);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("ran"), std::string::npos);
  EXPECT_NE(result.err.find("metrics: not served: cannot serve on port " + std::to_string(port)), std::string::npos)
      << result.err;
}

// Review 11: one client that connects and says nothing held civetweb's only thread for its
// 30 s request timeout, and every scrape of the node timed out meanwhile.
TEST(Metrics, IdleConnectionsDoNotStopScrapes) {
  TempDir scratch;
  const uint16_t port = FreePort();
  LaunchSpec spec;
  spec.args = {"run", "--root", scratch.path(), "--", "sleep", "8"};
  spec.set_env = {{"BT_METRICS_PORT", std::to_string(port)}};
  LauncherProcess launcher(spec);
  ASSERT_TRUE(launcher.WaitForLog("metrics: serving", 10s)) << launcher.Finish().err;
  std::vector<int> idle;
  for (int i = 0; i < 2; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(200ms);  // the server has taken them
  const auto asked = std::chrono::steady_clock::now();
  const std::string body = HttpGet(port, "/metrics");
  const auto took = std::chrono::steady_clock::now() - asked;
  for (int fd : idle) close(fd);
  EXPECT_NE(body.find("bt_launch_phase{"), std::string::npos) << body;
  EXPECT_LT(took, 3s);
  launcher.Signal(SIGTERM);
  EXPECT_EQ(launcher.Finish().exit_code, 143);
}

// Reviews 11 and 12: the metrics' server on MASTER_PORT took it from the training ("start
// command exited 1", nothing naming the metrics). The config's clash is refused as it is read
// (env tests); one the environment makes is this node's alone, and exiting would leave the
// others waiting for it at the rendezvous: it runs without metrics, saying why.
TEST(Metrics, APortTheTrainingOrTheRendezvousUsesIsNeverServed) {
  TempDir scratch;
  LaunchSpec spec;
  spec.args = {"run", "--root", scratch.path(), "--", "sh", "-c", "echo ran on $MASTER_PORT"};
  spec.set_env = {{"BT_METRICS_PORT", "29500"}};  // MASTER_PORT's default
  ProcessResult result = RunLauncher(spec);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("ran on 29500"), std::string::npos);
  EXPECT_NE(result.err.find("metrics: not served: port 29500 (BT_METRICS_PORT / launcher.metrics.port) is also a "
                            "MASTER_PORT of the training"),
            std::string::npos)
      << result.err;
  spec.set_env = {{"BT_METRICS_PORT", "29300"}};  // the rendezvous port's default
  result = RunLauncher(spec);
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("is also the rendezvous port"), std::string::npos) << result.err;
  // BT_RENDEZVOUS_PORT read as the rendezvous reads it: "+31000" is 31000.
  spec.set_env = {{"BT_METRICS_PORT", "31000"}, {"BT_RENDEZVOUS_PORT", "+31000"}};
  result = RunLauncher(spec);
  EXPECT_NE(result.err.find("is also the rendezvous port"), std::string::npos) << result.err;
}

// Review 12: node 0 learnt a hang's cause only at the job's end: until then the live
// badput{cause="hang"} read 0 and the hang counted as lost work.
TEST(Metrics, AHangCalledIsChargedToTheHangBucketWhileTheJobRuns) {
  TempDir scratch;
  const uint16_t port = FreePort();
  const std::string stop_file = scratch.path() + "/stop";
  nlohmann::json launcher = restart::RestartSettings(scratch, 1);
  launcher["watchdog"] = {{"stall_timeout_s", 2}, {"startup_timeout_s", 2}, {"stack_timeout_s", 1},
                         {"report_dir", scratch.path() + "/reports"}};
  Job job(2, nlohmann::json::array({"if [ \"$BT_RESTART_COUNT\" = 0 ]; then echo working; exec sleep 100; fi; "
                                    "echo cycle 1; while [ ! -e \"$STOP_FILE\" ]; do echo tick; sleep 0.2; done"})
                 .dump(),
          "", false, launcher, FreePort());
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int rank = 0; rank < 2; ++rank) {
    std::map<std::string, std::string> env = {{"STOP_FILE", stop_file}};
    if (rank == 0) env["BT_METRICS_PORT"] = std::to_string(port);
    nodes.push_back(std::make_unique<LauncherProcess>(job.Spec(rank, {}, env)));
  }
  ASSERT_TRUE(nodes[0]->WaitForOutput("cycle 1", 40s)) << nodes[0]->Finish().err;
  // A snapshot taken in cycle 1 (node 0 publishes once a second; a busy machine delays it).
  std::string live;
  for (auto deadline = std::chrono::steady_clock::now() + 10s; std::chrono::steady_clock::now() < deadline;) {
    live = HttpGet(port, "/metrics");
    if (SampleValue(live, "bt_launch_restarts_used") == 1.0) break;
    std::this_thread::sleep_for(200ms);
  }
  WriteFile(stop_file);
  for (auto& node : nodes) EXPECT_EQ(node->Finish().exit_code, 0);
  const auto hang = SampleValue(live, "bt_launch_badput_seconds", "cause=\"hang\"");
  ASSERT_TRUE(hang.has_value()) << live;
  EXPECT_GE(*hang, 1.5) << live;  // the stall (2 s) until its call, less the first output's delay
  EXPECT_EQ(SampleValue(live, "bt_launch_restarts_used"), 1.0) << live;
}

TEST(Metrics, ABadPortVariableIsAConfigErrorNamingIt) {
  TempDir scratch;
  LaunchSpec spec;
  spec.args = {"run", "--root", scratch.path(), "--", "true"};
  spec.set_env = {{"BT_METRICS_PORT", "9x"}};
  const ProcessResult result = RunLauncher(spec);
  EXPECT_EQ(result.exit_code, 65) << result.err;
  EXPECT_NE(result.err.find("BT_METRICS_PORT: expected a port"), std::string::npos) << result.err;
}

}  // namespace goodput

}  // namespace
}  // namespace bt::testing
