// Before the first command: weights staged or waited for, the ready barrier across nodes,
// and the project cache seeded exactly once across concurrent jobs. Real bt-launch
// processes, each bounded; every process a test starts is gone when it ends.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using json = nlohmann::json;

size_t CountLines(const std::string& path) {
  std::ifstream file(path);
  size_t lines = 0;
  for (std::string line; std::getline(file, line);) ++lines;
  return lines;
}

class Prepare : public ::testing::Test {
 protected:
  std::string Mount() const { return dir_.path() + "/models/base"; }

  json Config(const std::vector<std::string>& commands) {
    return {{"runtime", {{"start_commands", commands}}}, {"launcher", {{"grace_period_s", 3}}}};
  }

  std::string Save(const json& config) { return dir_.Write("job-" + std::to_string(++configs_) + ".json", config.dump()); }

  // The project cache is shared by every job of the project, as the platform mounts it.
  LaunchSpec Run(const std::string& config, const std::string& root = "root") {
    return {{"run", "--config", config, "--root", dir_.path() + "/" + root},
            {{"BT_PROJECT_CACHE_DIR", Cache()}},
            {"BT_JOB_CONFIG"},
            std::nullopt,
            60s};
  }

  LaunchSpec Node(const std::string& config, int rank, int count, uint16_t port, const std::string& root) {
    LaunchSpec spec = Run(config, root);
    spec.set_env.insert({{"BT_NODE_RANK", std::to_string(rank)}, {"BT_GROUP_SIZE", std::to_string(count)},
                         {"BT_LEADER_ADDR", "127.0.0.1"}, {"BT_RENDEZVOUS_TOKEN", "prepare-test"},
                         {"BT_RENDEZVOUS_PORT", std::to_string(port)}});
    return spec;
  }

  json WithWeights(json config, const json& weights, const json& settings = json::object()) {
    config["weights"] = json::array({weights});
    if (!settings.empty()) config["launcher"]["weights"] = settings;
    return config;
  }

  json WithSeed(json config, const std::vector<std::string>& seed, double lease_s = 60) {
    config["runtime"]["cache_config"] = {{"enabled", true}};
    config["launcher"]["cache"] = {{"seed_commands", seed}, {"lease_s", lease_s}};
    return config;
  }

  std::string Cache() const { return dir_.path() + "/project-cache"; }

  TempDir dir_;
  int configs_ = 0;
};

TEST_F(Prepare, FileSourceIsStagedWithPatternsByHardLinksOnceAndLeftAloneAfter) {
  WriteFile(dir_.path() + "/src/config.json", "{}");
  WriteFile(dir_.path() + "/src/weights/model.safetensors", std::string(100000, 'w'));
  WriteFile(dir_.path() + "/src/original/consolidated.pth", "big");
  WriteFile(dir_.path() + "/src/notes.txt", "skip");
  json weights = {{"source", "file://" + dir_.path() + "/src"}, {"mount_location", Mount()},
                  {"allow_patterns", {"*.json", "weights/", "*.pth", "missing-*"}}, {"ignore_patterns", {"original/"}}};
  std::string config = Save(WithWeights(Config({"test -f " + Mount() + "/weights/model.safetensors && echo saw-weights"}), weights));
  ProcessResult first = RunLauncher(Run(config));
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("saw-weights"), std::string::npos);
  EXPECT_TRUE(fs::exists(Mount() + "/.complete"));
  EXPECT_TRUE(fs::exists(Mount() + "/config.json"));
  EXPECT_FALSE(fs::exists(Mount() + "/notes.txt"));
  EXPECT_FALSE(fs::exists(Mount() + "/original"));
  struct stat source {};
  struct stat staged {};
  stat((dir_.path() + "/src/weights/model.safetensors").c_str(), &source);
  stat((Mount() + "/weights/model.safetensors").c_str(), &staged);
  EXPECT_EQ(source.st_ino, staged.st_ino) << "same filesystem: a hard link, not a copy";
  EXPECT_NE(first.err.find("allow pattern \"missing-*\" matches nothing in file://"), std::string::npos) << first.err;

  ProcessResult second = RunLauncher(Run(config));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.err.find("staging"), std::string::npos) << "a complete mount is not staged again:\n" << second.err;
}

// The Hugging Face hub cache: snapshots/<rev>/<file> is a relative symlink into blobs/.
// Hard-linked as a link, it dangled in the mount, which was marked complete anyway.
TEST_F(Prepare, RelativeSymlinksAreStagedAsTheirTargetsBytes) {
  const std::string cache = dir_.path() + "/hub/models--org--model";
  WriteFile(cache + "/blobs/0123abcd", std::string(5000, 'b'));
  fs::create_directories(cache + "/snapshots/rev1");
  fs::create_symlink("../../blobs/0123abcd", cache + "/snapshots/rev1/model.safetensors");
  json weights = {{"source", "file://" + cache + "/snapshots/rev1"}, {"mount_location", Mount()}};
  ProcessResult result = RunLauncher(Run(Save(WithWeights(Config({"cmp " + Mount() + "/model.safetensors " + cache + "/blobs/0123abcd"}), weights))));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_TRUE(fs::exists(Mount() + "/.complete"));
  EXPECT_FALSE(fs::is_symlink(Mount() + "/model.safetensors"));
  EXPECT_EQ(ReadFile(Mount() + "/model.safetensors"), std::string(5000, 'b'));
}

TEST_F(Prepare, CrashedStagingIsCleanedAndRedone) {
  WriteFile(dir_.path() + "/src/model.bin", "weights");
  WriteFile(dir_.path() + "/models/.base.bt-staging-99999/model.bin", "half");  // what a SIGKILL leaves
  json weights = {{"source", "file://" + dir_.path() + "/src"}, {"mount_location", Mount()}};
  ProcessResult result = RunLauncher(Run(Save(WithWeights(Config({"true"}), weights))));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("left by a staging that did not finish"), std::string::npos) << result.err;
  EXPECT_FALSE(fs::exists(dir_.path() + "/models/.base.bt-staging-99999"));
  EXPECT_EQ(ReadFile(Mount() + "/model.bin"), "weights");
}

TEST_F(Prepare, StagingKilledMidwayIsRedoneByTheNextRun) {
  // On another filesystem than the mount, so every byte is copied and staging takes a while.
  TempDir shm_parent;  // only for its unique name
  const std::string source = "/dev/shm/" + fs::path(shm_parent.path()).filename().string();
  for (int i = 0; i < 16; ++i) WriteFile(source + "/shard-" + std::to_string(i), std::string(64 << 20, char('a' + i)));
  json weights = {{"source", "file://" + source}, {"mount_location", Mount()}};
  std::string config = Save(WithWeights(Config({"true"}), weights));
  {
    LauncherProcess first(Run(config));
    ASSERT_TRUE(first.WaitForLog("weights: staging file://", 30s));
    std::this_thread::sleep_for(100ms);
    first.Signal(SIGKILL);
    EXPECT_EQ(first.Finish().exit_code, 137);
  }
  EXPECT_FALSE(fs::exists(Mount() + "/.complete")) << "killed after staging had finished: the test proves nothing";
  ProcessResult second = RunLauncher(Run(config));
  fs::remove_all(source);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("left by a staging that did not finish"), std::string::npos) << second.err;
  EXPECT_EQ(fs::file_size(Mount() + "/shard-15"), 64u << 20);
  EXPECT_TRUE(fs::exists(Mount() + "/.complete"));
}

// An rclone stand-in first on PATH: `lsf` lists one 1000-byte file; `copy` writes 300 bytes
// of it, then runs for as long as --max-duration allows and exits 7 (fatal), as rclone 1.60
// can when that duration cuts a transfer.
class PrepareWithRclone : public Prepare {
 protected:
  void SetUp() override {
    // One process (no child to orphan when it is killed).
    WriteFile(Bin() + "/rclone", "#!/usr/bin/env python3\n"
                                 "import os, sys, time\n"
                                 "open('" + dir_.path() + "/rclone.pid', 'w').write(str(os.getpid()))\n"
                                 "args = sys.argv[1:]\n"
                                 "if 'lsf' in args:\n"
                                 "    print('1000\\tmodel.bin')\n"
                                 "    sys.exit(0)\n"
                                 "limit = float(args[args.index('--max-duration') + 1].rstrip('s'))\n"
                                 "open(os.path.join(args[-1], 'model.bin'), 'wb').write(bytes(300))\n"
                                 "time.sleep(limit)\n"
                                 "sys.exit(7)\n");
    fs::permissions(Bin() + "/rclone", fs::perms::owner_all);
  }

  std::string Bin() const { return dir_.path() + "/bin"; }

  LaunchSpec RunWithStandIn(const std::string& config) {
    LaunchSpec spec = Run(config);
    spec.set_env["PATH"] = Bin() + ":" + std::string(std::getenv("PATH"));
    spec.set_env["AWS_ACCESS_KEY_ID"] = "test";
    spec.set_env["AWS_SECRET_ACCESS_KEY"] = "test";
    return spec;
  }

  bool RcloneGone() const {
    const std::string pid = ReadFile(dir_.path() + "/rclone.pid");
    if (pid.empty()) return true;
    const std::string stat = ReadFile("/proc/" + std::to_string(std::stoi(pid)) + "/stat");
    return stat.empty() || stat.find(") Z") != std::string::npos;
  }
};

// SIGTERM was not acted on while rclone staged weights, for up to launcher.weights.timeout_s.
TEST_F(PrepareWithRclone, SigtermWhileRcloneStagesStopsWithinASecondAndMarksNothing) {
  json weights = {{"source", "s3://bucket/model"}, {"mount_location", Mount()}};
  LauncherProcess launcher(RunWithStandIn(Save(WithWeights(Config({"true"}), weights))));
  ASSERT_TRUE(launcher.WaitForLog("through rclone", 30s));
  std::this_thread::sleep_for(500ms);
  const auto signalled = std::chrono::steady_clock::now();
  launcher.Signal(SIGTERM);
  ProcessResult result = launcher.Finish();
  EXPECT_LT(std::chrono::steady_clock::now() - signalled, 5s) << result.err;
  EXPECT_NE(result.exit_code, 0) << result.err;
  EXPECT_FALSE(fs::exists(Mount() + "/.complete"));
  EXPECT_TRUE(RcloneGone()) << "rclone still runs";
  for (const auto& entry : fs::directory_iterator(dir_.path() + "/models")) {
    EXPECT_EQ(entry.path().filename().string().find(".bt-staging-"), std::string::npos) << entry.path();
  }
}

// The deadline cutting the transfer was reported as "fatal error, such as bad credentials".
TEST_F(PrepareWithRclone, TheDeadlineCuttingATransferSaysSoWithTheBytesStaged) {
  json weights = {{"source", "s3://bucket/model"}, {"mount_location", Mount()}};
  ProcessResult result = RunLauncher(RunWithStandIn(Save(WithWeights(Config({"true"}), weights, {{"timeout_s", 3}}))));
  EXPECT_EQ(result.exit_code, 74) << result.err;
  EXPECT_NE(result.err.find("weights not complete after launcher.weights.timeout_s: " + Mount()), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("still staging, 300 B of 1000 B"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("bad credentials"), std::string::npos) << result.err;
  EXPECT_FALSE(fs::exists(Mount() + "/.complete"));
}

// An rclone stand-in whose `copy` exits 0 but leaves model.bin as the test asks (`mode`):
// a link to nothing, or cut short. rclone says it copied; the mount must not be marked
// complete on its word.
class PrepareWithLyingRclone : public PrepareWithRclone {
 protected:
  void SetUp() override {
    WriteFile(Bin() + "/rclone", "#!/usr/bin/env python3\n"
                                 "import os, sys\n"
                                 "args = sys.argv[1:]\n"
                                 "if 'lsf' in args:\n"
                                 "    print('1000\\tmodel.bin')\n"
                                 "    print('5\\tconfig.json')\n"
                                 "    sys.exit(0)\n"
                                 "open(os.path.join(args[-1], 'config.json'), 'w').write('{\"a\"}')\n"
                                 "model = os.path.join(args[-1], 'model.bin')\n"
                                 "if open('" + dir_.path() + "/mode').read() == 'dangling':\n"
                                 "    os.symlink('/nonexistent/blob', model)\n"
                                 "else:\n"
                                 "    open(model, 'wb').write(bytes(300))\n");
    fs::permissions(Bin() + "/rclone", fs::perms::owner_all);
  }
};

TEST_F(PrepareWithLyingRclone, AMountWhoseFileDoesNotOpenIsNotMarkedComplete) {
  json weights = {{"source", "s3://bucket/model"}, {"mount_location", Mount()}};
  const std::string config = Save(WithWeights(Config({"echo the job ran"}), weights));
  const std::map<std::string, std::string> expected = {{"dangling", "model.bin does not open"},
                                                       {"short", "model.bin is not the 1000-byte file the source listed"}};
  for (const auto& [mode, message] : expected) {
    WriteFile(dir_.path() + "/mode", mode);
    ProcessResult result = RunLauncher(RunWithStandIn(config));
    EXPECT_EQ(result.exit_code, 74) << mode << "\n" << result.err;
    EXPECT_NE(result.err.find(message), std::string::npos) << mode << "\n" << result.err;
    EXPECT_NE(result.err.find("weights[0]: staged "), std::string::npos) << mode << "\n" << result.err;
    EXPECT_EQ(result.out.find("the job ran"), std::string::npos) << mode;
    EXPECT_FALSE(fs::exists(Mount() + "/.complete")) << mode;
    EXPECT_FALSE(fs::exists(Mount() + "/model.bin")) << mode;
  }
}

TEST_F(Prepare, MissingFileSourceExits65NamingIt) {
  json weights = {{"source", "file://" + dir_.path() + "/nowhere"}, {"mount_location", Mount()}};
  ProcessResult result = RunLauncher(Run(Save(WithWeights(Config({"true"}), weights))));
  EXPECT_EQ(result.exit_code, 65) << result.err;
  EXPECT_NE(result.err.find("weights[0].source: file://" + dir_.path() + "/nowhere does not exist"), std::string::npos)
      << result.err;
}

TEST_F(Prepare, SecretThatIsNotJsonExits65WithoutItsValue) {
  WriteFile(dir_.path() + "/root/secrets/s3-weights", "AKIA-NOT-JSON-TOPSECRET");
  json weights = {{"source", "s3://bucket/models/base"}, {"mount_location", Mount()}, {"auth_secret_name", "s3-weights"}};
  ProcessResult result = RunLauncher(Run(Save(WithWeights(Config({"true"}), weights))));
  EXPECT_EQ(result.exit_code, 65) << result.err;
  EXPECT_NE(result.err.find("weights[0].auth_secret_name: secret \"s3-weights\": expected a JSON object"), std::string::npos)
      << result.err;
  EXPECT_EQ(result.err.find("TOPSECRET"), std::string::npos);
}

TEST_F(Prepare, PlatformMountThatNeverCompletesExits74NamingWhatIsMissing) {
  WriteFile(Mount() + "/config.json", "{}");
  WriteFile(Mount() + "/.tmp8f3a.safetensors", "downloading");
  json weights = {{"source", "hf://meta-llama/Llama-3.1-8B"}, {"mount_location", Mount()}};
  ProcessResult result = RunLauncher(Run(Save(WithWeights(Config({"echo must-not-run"}), weights, {{"timeout_s", 2}}))));
  EXPECT_EQ(result.exit_code, 74) << result.err;
  EXPECT_EQ(result.out.find("must-not-run"), std::string::npos);
  EXPECT_NE(result.err.find("weights not complete after launcher.weights.timeout_s: " + Mount() +
                            " (from hf://meta-llama/Llama-3.1-8B): .complete missing, 1 .tmp file(s) left (.tmp8f3a.safetensors)"),
            std::string::npos)
      << result.err;
  EXPECT_NE(result.err.find("not downloaded by bt-launch"), std::string::npos) << result.err;
  EXPECT_LT(result.elapsed, 10s);
}

TEST_F(Prepare, PlatformMountCompletingWhileWaitingLetsTheJobStart) {
  WriteFile(Mount() + "/config.json", "{}");
  json weights = {{"source", "hf://org/model"}, {"mount_location", Mount()}};
  LauncherProcess launcher(Run(Save(WithWeights(Config({"echo started"}), weights, {{"timeout_s", 30}}))));
  ASSERT_TRUE(launcher.WaitForLog("waiting for the platform to mount it", 10s));
  std::this_thread::sleep_for(1s);
  EXPECT_FALSE(launcher.WaitForOutput("started", 100ms)) << "started before the mount was complete";
  WriteFile(Mount() + "/.complete");
  ProcessResult result = launcher.Finish();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("started"), std::string::npos);
}

// Node 0 is ready; node 1 waits for a mount that never completes. Node 0 dies: node 1 stops
// at once naming the leader, not at its own weights deadline (60 s).
TEST_F(Prepare, LeaderLostWhileAFollowerWaitsForItsWeightsStopsItAtOnce) {
  const uint16_t port = FreePort();
  WriteFile(dir_.path() + "/ready-mount/.complete");
  WriteFile(Mount() + "/shard-1", "partial");
  json node0 = WithWeights(Config({"true"}), {{"source", "hf://org/a"}, {"mount_location", dir_.path() + "/ready-mount"}});
  json node1 = WithWeights(Config({"true"}), {{"source", "hf://org/b"}, {"mount_location", Mount()}}, {{"timeout_s", 60}});
  for (json* config : {&node0, &node1}) (*config)["compute"] = {{"node_count", 2}};
  LauncherProcess leader(Node(Save(node0), 0, 2, port, "root"));
  LauncherProcess follower(Node(Save(node1), 1, 2, port, "root"));
  ASSERT_TRUE(follower.WaitForLog("waiting for the platform to mount it", 20s));
  ASSERT_TRUE(leader.WaitForLog("all 2 nodes joined", 20s));
  std::this_thread::sleep_for(1500ms);  // node 1 has published its phase through the leader's store
  const auto killed = std::chrono::steady_clock::now();
  leader.Signal(SIGKILL);
  ProcessResult result = follower.Finish();
  EXPECT_EQ(result.exit_code, 69) << result.err;
  EXPECT_NE(result.err.find("leader (node 0) lost"), std::string::npos) << result.err;
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 15s) << result.err;
}

TEST_F(Prepare, ReadyBarrierNamesTheNodeStillPreparing) {
  const uint16_t port = FreePort();
  WriteFile(dir_.path() + "/ready-mount/.complete");
  WriteFile(Mount() + "/shard-1", std::string(5000, 'x'));  // node 1's mount: delivered in part, never completed
  json node0 = WithWeights(Config({"true"}), {{"source", "hf://org/a"}, {"mount_location", dir_.path() + "/ready-mount"}},
                           {{"timeout_s", 3}});
  json node1 = WithWeights(Config({"true"}), {{"source", "hf://org/b"}, {"mount_location", Mount()}}, {{"timeout_s", 40}});
  node0["launcher"]["weights"]["timeout_s"] = 12;  // long enough for one roster line (every 10 s)
  for (json* config : {&node0, &node1}) (*config)["compute"] = {{"node_count", 2}};
  LauncherProcess leader(Node(Save(node0), 0, 2, port, "root"));
  LauncherProcess follower(Node(Save(node1), 1, 2, port, "root"));
  ProcessResult first = leader.Finish();
  ProcessResult second = follower.Finish();
  EXPECT_EQ(first.exit_code, 69) << first.err;
  EXPECT_NE(first.err.find("nodes not ready by the weights deadline (launcher.weights.timeout_s): node 1 ("), std::string::npos)
      << first.err;
  EXPECT_NE(first.err.find("waiting for " + Mount() + ": 1 files"), std::string::npos) << first.err;
  EXPECT_NE(first.err.find("waiting for every node to be ready: node 0 ("), std::string::npos) << first.err;
  EXPECT_NE(first.err.find(") ready; node 1 ("), std::string::npos) << "the roster shows every node's phase:\n" << first.err;
  EXPECT_NE(second.exit_code, 0) << second.err;
  EXPECT_LT(second.elapsed, 25s) << "node 1 waited for its own deadline instead of stopping with node 0";
  EXPECT_GE(first.elapsed, 11s);
}

TEST_F(Prepare, ThreeConcurrentTwoNodeJobsSeedTheSharedCacheExactlyOnce) {
  // All six nodes share this host, so they also share one weights mount: staged once.
  WriteFile(dir_.path() + "/src/model.bin", "weights");
  const json weights = {{"source", "file://" + dir_.path() + "/src"}, {"mount_location", Mount()}};
  const std::string seed = "echo $BT_TRAINING_JOB_ID >> $BT_PROJECT_CACHE_DIR/seeded-by && sleep 1 && "
                           "echo rows > $BT_PROJECT_CACHE_DIR/dataset.txt";
  std::vector<std::unique_ptr<LauncherProcess>> nodes;
  for (int job = 0; job < 3; ++job) {
    json config = WithWeights(WithSeed(Config({"cat $BT_PROJECT_CACHE_DIR/dataset.txt " + Mount() + "/model.bin"}), {seed}), weights);
    config["compute"] = {{"node_count", 2}};
    config["launcher"]["job_id"] = "job-" + std::to_string(job);
    const std::string path = Save(config);
    const uint16_t port = FreePort();
    for (int rank = 0; rank < 2; ++rank) {
      nodes.push_back(std::make_unique<LauncherProcess>(Node(path, rank, 2, port, "root-" + std::to_string(job))));
    }
  }
  size_t staged = 0;
  for (auto& node : nodes) {
    ProcessResult result = node->Finish();
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("rows"), std::string::npos) << "a node started before the seed was there:\n" << result.err;
    EXPECT_NE(result.out.find("weights"), std::string::npos) << "a node started before the weights were there";
    staged += result.err.find("weights: staged file://") != std::string::npos;
  }
  EXPECT_EQ(CountLines(Cache() + "/seeded-by"), 1u) << ReadFile(Cache() + "/seeded-by");
  EXPECT_EQ(staged, 1u) << "the shared mount was staged by more than one node";
}

TEST_F(Prepare, LeaderKilledDuringTheSeedLosesItsLeaseAndTheNextJobSeeds) {
  const std::string seed = "echo run >> $BT_PROJECT_CACHE_DIR/runs && if [ ! -f $BT_PROJECT_CACHE_DIR/hang-once ]; then "
                           "touch $BT_PROJECT_CACHE_DIR/hang-once && echo $$ > " + dir_.path() + "/seed.pid && sleep 60; fi && "
                           "echo rows > $BT_PROJECT_CACHE_DIR/dataset.txt";
  const std::string config = Save(WithSeed(Config({"cat $BT_PROJECT_CACHE_DIR/dataset.txt"}), {seed}, 2));
  {
    LauncherProcess first(Run(config, "root-a"));
    ASSERT_TRUE(first.WaitForLog("cache seed command 1/1", 20s));
    while (!fs::exists(dir_.path() + "/seed.pid")) std::this_thread::sleep_for(20ms);
    first.Signal(SIGKILL);
    EXPECT_EQ(first.Finish().exit_code, 137);
    kill(-std::stoi(ReadFile(dir_.path() + "/seed.pid")), SIGKILL);  // the seed's own process group
  }
  ProcessResult second = RunLauncher(Run(config, "root-b"));
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_NE(second.err.find("taking it over"), std::string::npos) << second.err;
  EXPECT_NE(second.out.find("rows"), std::string::npos);
  EXPECT_EQ(CountLines(Cache() + "/runs"), 2u);
  size_t markers = 0;
  for (const auto& entry : fs::directory_iterator(Cache() + "/.bt-seed")) markers += entry.path().extension() == ".done";
  EXPECT_EQ(markers, 1u);
  ProcessResult third = RunLauncher(Run(config, "root-c"));
  ASSERT_EQ(third.exit_code, 0) << third.err;
  EXPECT_NE(third.err.find("cache seed: already done"), std::string::npos) << third.err;
  EXPECT_EQ(CountLines(Cache() + "/runs"), 2u) << "a seeded key ran again";

  json reseed = WithSeed(Config({"true"}), {seed}, 2);
  reseed["launcher"]["cache"]["seed_key"] = "dataset-v2";  // another key: the old marker does not count
  ProcessResult fourth = RunLauncher(Run(Save(reseed), "root-d"));
  ASSERT_EQ(fourth.exit_code, 0) << fourth.err;
  EXPECT_EQ(CountLines(Cache() + "/runs"), 3u);
}

// What SeedKey computes for one command and no seed_key: SHA-256 of "<command>\0\x01".
std::string SeedKeyOf(const std::string& command) {
  const std::string script = "python3 -c 'import hashlib,sys; print(hashlib.sha256(sys.argv[1].encode() + b\"\\0\\x01\").hexdigest())' '" +
                             command + "'";
  std::FILE* pipe = popen(script.c_str(), "r");
  char line[128] = {};
  if (pipe == nullptr) return "";
  const bool read = std::fgets(line, sizeof line, pipe) != nullptr;
  pclose(pipe);
  return read ? std::string(line, 64) : "";
}

std::string LeaseText(const std::string& host, uint64_t renewals) {
  // The holder's clock a day behind this one: what a waiter whose clock runs ahead sees.
  return json{{"host", host}, {"pid", 1}, {"job_id", "holder"}, {"renewed_unix", int64_t(std::time(nullptr)) - 86400},
              {"renewals", renewals}}.dump();
}

// A lease whose holder is alive (its flock held on this host) was taken over because its
// renewal time, by another clock, looked older than lease_s: the seed ran twice at once.
TEST_F(Prepare, ALockedLeaseOnThisHostIsNeverTakenOverWhateverItsClockSays) {
  const std::string seed = "echo run >> $BT_PROJECT_CACHE_DIR/runs";
  const std::string stem = Cache() + "/.bt-seed/" + SeedKeyOf(seed);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  WriteFile(stem + ".lease", LeaseText(host, 1));
  const int lock = open((stem + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX), 0);
  LauncherProcess launcher(Run(Save(WithSeed(Config({"true"}), {seed}, 1))));
  std::this_thread::sleep_for(4s);
  EXPECT_FALSE(fs::exists(Cache() + "/runs")) << "a live holder's lease was taken over";
  fs::remove(stem + ".lease");  // the holder finishes without a marker, as a failed seed does
  close(lock);
  ProcessResult result = launcher.Finish();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(CountLines(Cache() + "/runs"), 1u);
}

// Across hosts the lease's own renewals decide, not two clocks: renewed, it is kept however
// old its time looks; unrenewed for lease_s, it is taken over.
TEST_F(Prepare, ALeaseOfAnotherHostIsJudgedByItsRenewals) {
  const std::string seed = "echo run >> $BT_PROJECT_CACHE_DIR/runs";
  const std::string stem = Cache() + "/.bt-seed/" + SeedKeyOf(seed);
  WriteFile(stem + ".lease", LeaseText("other-host", 1));
  std::atomic<bool> renewing = true;
  std::thread holder([&] {
    for (uint64_t renewals = 2; renewing; ++renewals) {
      WriteFile(stem + ".lease.tmp", LeaseText("other-host", renewals));
      fs::rename(stem + ".lease.tmp", stem + ".lease");
      std::this_thread::sleep_for(250ms);
    }
  });
  LauncherProcess launcher(Run(Save(WithSeed(Config({"true"}), {seed}, 1))));
  std::this_thread::sleep_for(4s);
  renewing = false;
  holder.join();
  EXPECT_FALSE(fs::exists(Cache() + "/runs")) << "a lease renewed every 250 ms was taken over";
  ProcessResult result = launcher.Finish();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("other-host (pid 1, job holder) was not renewed for launcher.cache.lease_s"), std::string::npos)
      << result.err;
  EXPECT_EQ(CountLines(Cache() + "/runs"), 1u);
}

// A lease on the shared volume whose fields are of other types (another tool's file, a
// torn rewrite by another version): read as no renewal, taken over after lease_s. Before,
// nlohmann's type_error left the cache phase and the launcher ended with an internal error.
TEST_F(Prepare, ALeaseWithFieldsOfOtherTypesIsTakenOverAfterLeaseS) {
  const std::string seed = "echo run >> $BT_PROJECT_CACHE_DIR/runs";
  const std::string stem = Cache() + "/.bt-seed/" + SeedKeyOf(seed);
  WriteFile(stem + ".lease", R"({"host": 7, "pid": "x", "job_id": [], "renewed_unix": "y", "renewals": -1})");
  ProcessResult result = LauncherProcess(Run(Save(WithSeed(Config({"true"}), {seed}, 1)))).Finish();
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.err.find("was not renewed for launcher.cache.lease_s"), std::string::npos) << result.err;
  EXPECT_EQ(CountLines(Cache() + "/runs"), 1u);
}

TEST_F(Prepare, FailedSeedFailsEveryNodeAndLeavesNoMarker) {
  json config = WithSeed(Config({"echo must-not-run"}), {"echo preparing", "exit 3"});
  config["compute"] = {{"node_count", 2}};
  const std::string path = Save(config);
  const uint16_t port = FreePort();
  LauncherProcess leader(Node(path, 0, 2, port, "root"));
  LauncherProcess follower(Node(path, 1, 2, port, "root"));
  ProcessResult first = leader.Finish();
  ProcessResult second = follower.Finish();
  EXPECT_EQ(first.exit_code, 3) << first.err;
  EXPECT_NE(first.err.find("cache seed command 2 exited with code 3: exit 3"), std::string::npos) << first.err;
  // The seed command's code is the job's result on every node (69 would hide it from srun).
  EXPECT_EQ(second.exit_code, 3) << second.err;
  EXPECT_NE(second.err.find("cache seed command 2 exited with code 3"), std::string::npos) << second.err;
  EXPECT_EQ(first.out.find("must-not-run"), std::string::npos);
  EXPECT_EQ(second.out.find("must-not-run"), std::string::npos);
  for (const auto& entry : fs::directory_iterator(Cache() + "/.bt-seed")) {
    EXPECT_NE(entry.path().extension(), ".done") << entry.path();
    EXPECT_NE(entry.path().extension(), ".lease") << "the lease was not released";
  }
}

}  // namespace
}  // namespace bt::testing
