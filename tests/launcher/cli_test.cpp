// The command line and the launcher's own exit codes, through the real binary.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

#include <sstream>

namespace bt::testing {
namespace {

constexpr const char* kSecretValue = "hf_TOPSECRET_0123456789";

TEST(Cli, UnknownSubcommandIsAUsageError) {
  ProcessResult result = RunLauncher({{"launch"}});
  EXPECT_EQ(result.exit_code, 64);
  EXPECT_NE(result.err.find("unknown subcommand \"launch\""), std::string::npos);
}

TEST(Cli, UnknownFlagIsAUsageError) {
  EXPECT_EQ(RunLauncher({{"run", "--no-such-flag", "--", "true"}}).exit_code, 64);
}

TEST(Cli, CommandWithoutDashDashIsAUsageError) {
  ProcessResult result = RunLauncher({{"run", "true"}});
  EXPECT_EQ(result.exit_code, 64);
  EXPECT_NE(result.err.find("put the command after `--`"), std::string::npos);
}

TEST(Cli, NothingToRunIsAConfigError) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"run", "--root", dir.path()}, {}, {"BT_JOB_CONFIG"}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("runtime.start_commands"), std::string::npos) << result.err;
}

TEST(Cli, BadConfigExits65NamingThePath) {
  TempDir dir;
  std::string config = dir.Write("job.json", R"({"runtime": {"start_commands": ["x"], "environment_variables": {"HF_TOKEN": 5}}})");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path()}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("runtime.environment_variables.HF_TOKEN: expected a string or {\"name\": SECRET}"),
            std::string::npos)
      << result.err;
}

TEST(Cli, ConfigFromBtJobConfigInline) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"env", "--root", dir.path(), "--format", "json"},
                                      {{"BT_JOB_CONFIG", R"({"name": "from-env"})"}}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["BT_TRAINING_JOB_NAME"], "from-env");
}

TEST(Cli, OmittedNodeCountTakesTheIdentitysAndAnExplicitOneIsChecked) {
  TempDir dir;
  std::string config = dir.Write("job.json", R"({"runtime": {"start_commands": ["true"]}})");
  std::vector<std::string> identity = {"--node-rank", "1", "--node-count", "3", "--leader-addr", "node-0"};
  LaunchSpec spec{{"env", "--config", config, "--root", dir.path(), "--format", "json"}};
  spec.args.insert(spec.args.end(), identity.begin(), identity.end());
  ProcessResult result = RunLauncher(spec);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(nlohmann::json::parse(result.out)["BT_GROUP_SIZE"], "3");

  spec.args[2] = dir.Write("explicit.json", R"({"compute": {"node_count": 2}, "runtime": {"start_commands": ["true"]}})");
  result = RunLauncher(spec);
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("disagrees with compute.node_count 2"), std::string::npos) << result.err;
}

TEST(Cli, BadIdentityExits65) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"run", "--root", dir.path(), "--node-rank", "3", "--node-count", "2", "--", "true"}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("node rank 3 from flags is outside [0, 2)"), std::string::npos) << result.err;
}

TEST(Cli, CountDisagreeingWithTheConfigExits65) {
  TempDir dir;
  std::string config = dir.Write("job.json", R"({"compute": {"node_count": 4}})");
  ProcessResult result = RunLauncher({{"run", "--config", config, "--root", dir.path(), "--node-rank", "0",
                                       "--node-count", "2", "--leader-addr", "h", "--", "true"}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("node count 2 from flags disagrees with compute.node_count 4"), std::string::npos) << result.err;
}

// Two jobs sharing a node: the second node 0 finds the port taken. The error names the
// likely cause and both ways out, not only the errno text.
TEST(Cli, RendezvousPortInUseNamesAnotherJobAndTheFix) {
  TempDir dir;
  const uint16_t port = FreePort();
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(port);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  ProcessResult result = RunLauncher({{"run", "--root", dir.path(), "--node-rank", "0", "--node-count", "2",
                                       "--leader-addr", "127.0.0.1", "--", "true"},
                                      {{"BT_RENDEZVOUS_PORT", std::to_string(port)}}});
  close(holder);
  EXPECT_EQ(result.exit_code, 69);
  EXPECT_NE(result.err.find("Address already in use"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("another job"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("--exclusive"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("BT_RENDEZVOUS_PORT"), std::string::npos) << result.err;
}

// srun with two tasks per node: every task says why at once, before any rendezvous.
TEST(Cli, TwoSlurmTasksPerNodeExit65NamingTheFix) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"run", "--root", dir.path(), "--", "true"},
                                      {{"SLURM_JOB_ID", "7"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODEID", "0"},
                                       {"SLURM_NNODES", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                                       {"SLURM_STEP_NODELIST", "127.0.0.1"}}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("--ntasks-per-node=1"), std::string::npos) << result.err;
}

TEST(Cli, UncreatableRootExits74) {
  TempDir dir;
  std::string file = dir.Write("not-a-dir", "x");
  ProcessResult result = RunLauncher({{"run", "--root", file, "--", "true"}});
  EXPECT_EQ(result.exit_code, 74);
  EXPECT_NE(result.err.find("cannot create directory " + file), std::string::npos) << result.err;
}

TEST(Cli, EnvPrintsOneFlatJsonObjectWithoutMpiVariables) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"env", "--root", dir.path(), "--format", "json"},
                                      {{"OMPI_MCA_foo", "1"}, {"PMIX_NAMESPACE", "x"}, {"KEEP_ME", "yes"}}});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  auto json = nlohmann::json::parse(result.out);
  EXPECT_TRUE(json.is_object());
  for (const auto& [name, value] : json.items()) EXPECT_TRUE(value.is_string()) << name;
  EXPECT_FALSE(json.contains("OMPI_MCA_foo"));
  EXPECT_FALSE(json.contains("PMIX_NAMESPACE"));
  EXPECT_EQ(json["KEEP_ME"], "yes");
  EXPECT_EQ(json["BT_SCRATCH_DIR"], dir.path() + "/node-0/mnt/bt-scratch");
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/node-0")) << "env must not create anything";
}

TEST(Cli, EnvPrintsShellExports) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"env", "--root", dir.path()}});
  ASSERT_EQ(result.exit_code, 0);
  EXPECT_NE(result.out.find("export BT_NODE_RANK='0'\n"), std::string::npos);
}

// `run` refuses a destination with credentials in it (65); `env`, which shows what `run`
// would export, masks them in both formats and still prints the rest.
TEST(Cli, EnvMasksCredentialsInTheDestinationUri) {
  TempDir dir;
  for (const char* format : {"shell", "json"}) {
    ProcessResult result = RunLauncher({{"env", "--root", dir.path(), "--format", format},
                                        {{"BT_CHECKPOINT_DESTINATION", "s3://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG@bucket/x"}}});
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_EQ(result.out.find("wJalrXUtnFEMI"), std::string::npos) << result.out;
    EXPECT_EQ(result.out.find("AKIAEXAMPLE"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("s3://***@bucket/x"), std::string::npos) << result.out;
  }
}

// The benchmark runs its real leader and simulated nodes; the figures themselves are for
// docs/PERFORMANCE.md, the test checks the shape: one row per run, the JSON line last.
TEST(Cli, BenchRendezvousPrintsATableAndTheMedianAsTheLastLine) {
  ProcessResult result = RunLauncher({{"bench", "rendezvous", "--nodes", "48", "--runs", "2"}, {}, {}, {}, std::chrono::seconds(60)});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  std::vector<std::string> lines;
  std::istringstream out(result.out);
  for (std::string line; std::getline(out, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 4u) << result.out;
  EXPECT_EQ(lines[0].rfind("nodes", 0), 0u);
  EXPECT_EQ(lines[1].rfind("48     1", 0), 0u) << lines[1];
  const auto summary = nlohmann::json::parse(lines.back());
  EXPECT_EQ(summary.at("nodes"), 48);
  EXPECT_EQ(summary.at("runs"), 2);
  EXPECT_GT(summary.at("p50_s").get<double>(), 0);
  EXPECT_GE(summary.at("p50_s").get<double>(), summary.at("join_p50_s").get<double>());
  EXPECT_EQ(RunLauncher({{"bench", "rendezvous", "--nodes", "1"}}).exit_code, 64);
}

// --restart: one node fails once every node runs, node 0 pushes cycle 1 and every node
// passes the barrier; the restart phase is timed from the failure, the exit from the start.
TEST(Cli, BenchRendezvousRestartTimesOneRestartInPlace) {
  ProcessResult result =
      RunLauncher({{"bench", "rendezvous", "--restart", "--nodes", "24", "--runs", "1"}, {}, {}, {}, std::chrono::seconds(60)});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const std::string last = result.out.substr(result.out.rfind('\n', result.out.size() - 2) + 1);
  const auto summary = nlohmann::json::parse(last);
  EXPECT_EQ(summary.at("shape"), "restart");
  const double restart = summary.at("restart_p50_s").get<double>();
  EXPECT_GT(restart, 0);
  EXPECT_GT(summary.at("exit_p50_s").get<double>(), summary.at("ready_p50_s").get<double>());
  EXPECT_NE(result.err.find("restarting every node in cycle 1: node 23 ("), std::string::npos) << result.err;
  EXPECT_EQ(RunLauncher({{"bench", "rendezvous", "--restart", "--protocol-only"}}).exit_code, 64);
}

// Issue 31: even a single node's job ends with its goodput (the table, goodput.json and
// report.html), and `bt-launch report` draws the page again from the JSON.
TEST(Cli, AJobEndsWithItsGoodputAndReportDrawsItAgain) {
  TempDir dir;
  const std::string config = dir.Write("job.json", nlohmann::json{{"runtime", {{"start_commands", {"sleep 0.3"}}}},
                                                                   {"launcher", {{"watchdog", {{"report_dir", dir.path() + "/reports"}}}}}}
                                                       .dump());
  ProcessResult run = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.err.find("goodput:\n"), std::string::npos) << run.err;
  const nlohmann::json goodput = nlohmann::json::parse(ReadFile(dir.path() + "/reports/goodput.json"));
  EXPECT_GE(goodput["goodput_s"].get<double>(), 0.3);
  ASSERT_EQ(goodput["cycles"].size(), 1u);
  EXPECT_EQ(goodput["cycles"][0]["cause"], "success");
  ProcessResult report = RunLauncher({{"report", "--input", dir.path() + "/reports/goodput.json", "--out", dir.path() + "/job.html"}});
  ASSERT_EQ(report.exit_code, 0) << report.err;
  EXPECT_NE(report.out.find("report: " + dir.path() + "/job.html"), std::string::npos) << report.out;
  EXPECT_EQ(ReadFile(dir.path() + "/job.html"), ReadFile(dir.path() + "/reports/report.html"));
}

// A goodput.json cut short, or with a field of the wrong type, is refused naming the file and
// the field (65); a file that is not there, 74. Never a crash, never a page that lies.
TEST(Cli, ReportOfABadGoodputJsonExits65NamingTheFileAndTheField) {
  TempDir dir;
  ProcessResult run = RunLauncher({{"run", "--root", dir.path() + "/root", "--", "true"}});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string good = ReadFile(dir.path() + "/root/node-0/mnt/bt-scratch/bt-launch/goodput.json");
  const std::string truncated = dir.Write("truncated.json", good.substr(0, good.size() / 2));
  ProcessResult cut = RunLauncher({{"report", "--input", truncated, "--out", dir.path() + "/a.html"}});
  EXPECT_EQ(cut.exit_code, 65) << cut.err;
  EXPECT_NE(cut.err.find(truncated + ": "), std::string::npos) << cut.err;
  nlohmann::json wrong = nlohmann::json::parse(good);
  wrong["cycles"][0]["start_s"] = "soon";
  const std::string mistyped = dir.Write("mistyped.json", wrong.dump());
  ProcessResult typed = RunLauncher({{"report", "--input", mistyped, "--out", dir.path() + "/b.html"}});
  EXPECT_EQ(typed.exit_code, 65) << typed.err;
  EXPECT_NE(typed.err.find(mistyped + ": cycles[0].start_s: "), std::string::npos) << typed.err;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/b.html"));
  EXPECT_EQ(RunLauncher({{"report", "--input", dir.path() + "/absent.json"}}).exit_code, 74);
}

// Review 9, F1: a checkpoint whose name is not UTF-8 (a Lightning file named with byte 0xff)
// is committed as any other; the report then replaces the byte, and the job still exits 0
// (node 0 exited 70 on the report's JSON).
TEST(Cli, ACheckpointNameThatIsNotUtf8LeavesTheExitCodeAlone) {
  TempDir dir;
  const std::string train = dir.Write("train.sh", "for step in 1 2; do sleep 0.5; printf x > \"$BT_CHECKPOINT_DIR/ep$(printf '\\377')-$step.ckpt\"; done");
  const std::string config = dir.Write(
      "job.json", nlohmann::json{{"runtime", {{"start_commands", {"sh " + train}}, {"checkpointing_config", {{"enabled", true}}}}},
                                 {"launcher", {{"job_id", "u8-job"},
                                               {"watchdog", {{"report_dir", dir.path() + "/reports"}}},
                                               {"checkpoint", {{"destination", "file://" + dir.path() + "/remote"},
                                                               {"scan_interval_s", 0.2}, {"quiet_period_s", 0.3}}}}}}
                      .dump());
  ProcessResult run = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(ReadFile(dir.path() + "/remote/u8-job/latest"), "ep\xff-2.ckpt\n");
  const nlohmann::json goodput = nlohmann::json::parse(ReadFile(dir.path() + "/reports/goodput.json"));
  ASSERT_FALSE(goodput["commits"].empty());
  EXPECT_EQ(goodput["commits"].back()["name"], "ep\xef\xbf\xbd-2.ckpt");
}

// Review 10, F1 and F2: a step_pattern whose regex recurses per character (a leading `.*`)
// on a long line, or backtracks exponentially (`(a+)+b`), never costs the job its output or
// the launcher its life: the matching is off the relay's thread, on each line's first 1 KiB.
// With a pattern, the heartbeat (here off by one) is not read: one source (F4).
TEST(Cli, AStepPatternNeverStallsOrCrashesTheOutput) {
  for (const std::string pattern : {".*global_step=(\\d+)", "(?:a+)+b|global_step=(\\d+)"}) {
    TempDir dir;
    const std::string train = dir.Write(
        "train.sh", "head -c 6000 /dev/zero | tr '\\0' a; echo; for s in 1 2 3 4 5; do echo global_step=$s; "
                    "echo $((s - 1)) > $BT_HEARTBEAT_FILE; sleep 0.3; done; echo done-$(printf 'a%.0s' $(seq 27))");
    const std::string config = dir.Write(
        "job.json", nlohmann::json{{"runtime", {{"start_commands", {"sh " + train}}}},
                                   {"launcher", {{"watchdog", {{"report_dir", dir.path() + "/reports"}}},
                                                 {"progress", {{"step_pattern", pattern}}}}}}
                        .dump());
    const auto started = std::chrono::steady_clock::now();
    ProcessResult run = RunLauncher({{"run", "--config", config, "--root", dir.path() + "/root"}});
    ASSERT_EQ(run.exit_code, 0) << pattern << "\n" << run.err;
    EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(10)) << pattern;
    EXPECT_NE(run.out.find("global_step=5\n"), std::string::npos) << pattern;
    EXPECT_NE(run.out.find("done-aaaaaaaaaaaaaaaaaaaaaaaaaaa\n"), std::string::npos) << pattern;
    if (pattern.starts_with(".*")) {
      const nlohmann::json goodput = nlohmann::json::parse(ReadFile(dir.path() + "/reports/goodput.json"));
      ASSERT_TRUE(goodput["steps"].is_object()) << goodput.dump(1);
      EXPECT_EQ(goodput["steps"]["steps_done"], 4);
      EXPECT_EQ(goodput["steps"]["steps_redone"], 0);
    }
  }
}

TEST(Cli, JsonLogsCarryTheNodeRankOnEveryLine) {
  TempDir dir;
  ProcessResult result = RunLauncher({{"run", "--root", dir.path(), "--log-format", "json", "--", "true"}});
  ASSERT_EQ(result.exit_code, 0);
  size_t lines = 0;
  std::istringstream err(result.err);
  for (std::string line; std::getline(err, line); ++lines) {
    auto json = nlohmann::json::parse(line);
    EXPECT_EQ(json["node"], 0);
    EXPECT_TRUE(json.contains("msg"));
  }
  EXPECT_GE(lines, 2u);
}

class SecretTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_.Write("root/secrets/hf_access_token", std::string(kSecretValue) + "\n");
    config_ = dir_.Write("job.json", R"({"enable_baseten_workdir": false, "runtime": {
        "start_commands": ["test \"$HF_TOKEN\" = \")" + std::string(kSecretValue) + R"(\" && echo secret-matched"],
        "environment_variables": {"HF_TOKEN": {"name": "hf_access_token"}}}})");
  }
  void ExpectNoSecret(const ProcessResult& result) {
    EXPECT_EQ(result.out.find(kSecretValue), std::string::npos) << result.out;
    EXPECT_EQ(result.err.find(kSecretValue), std::string::npos) << result.err;
  }
  TempDir dir_;
  std::string config_;
};

TEST_F(SecretTest, TheJobGetsTheValueButNoOutputShowsIt) {
  ProcessResult run = RunLauncher({{"run", "--config", config_, "--root", dir_.path() + "/root", "--log-level", "trace"}});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NE(run.out.find("secret-matched"), std::string::npos);
  ExpectNoSecret(run);
  for (const char* format : {"shell", "json"}) {
    ProcessResult env = RunLauncher({{"env", "--config", config_, "--root", dir_.path() + "/root", "--format", format,
                                      "--log-level", "trace"}});
    EXPECT_EQ(env.exit_code, 0);
    EXPECT_NE(env.out.find("HF_TOKEN"), std::string::npos);
    ExpectNoSecret(env);
  }
  ProcessResult json_logs = RunLauncher({{"run", "--config", config_, "--root", dir_.path() + "/root", "--log-format", "json"}});
  ExpectNoSecret(json_logs);
}

TEST_F(SecretTest, MissingSecretExits65NamingIt) {
  std::filesystem::remove(dir_.path() + "/root/secrets/hf_access_token");
  ProcessResult result = RunLauncher({{"run", "--config", config_, "--root", dir_.path() + "/root"}});
  EXPECT_EQ(result.exit_code, 65);
  EXPECT_NE(result.err.find("secret \"hf_access_token\" not found"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace bt::testing
