// Real bt-launch processes on loopback, each reading its own fixture sysfs tree
// (BT_SYSFS_ROOT): the leader's fabric check under every launcher.fabric.require policy,
// and the NCCL variables each node's job sees.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>

#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;

std::string Tree(const std::string& fixture) { return std::string(BT_SOURCE_DIR) + "/tests/fixtures/fabric/" + fixture + "/sys"; }

constexpr const char* kShowNccl =
    "echo \"HCA=${NCCL_IB_HCA:-unset} DISABLE=${NCCL_IB_DISABLE:-unset} IFNAME=${NCCL_SOCKET_IFNAME:-unset} "
    "GLOO=${GLOO_SOCKET_IFNAME:-unset}\"";

// One job whose node i reads fixtures[i].
class FabricJob {
 public:
  FabricJob(std::vector<std::string> fixtures, const std::string& require, nlohmann::json fabric = nlohmann::json::object())
      : fixtures_(std::move(fixtures)), port_(FreePort()) {
    nlohmann::json launcher = {{"grace_period_s", 2},
                               {"rendezvous", {{"port", port_}, {"join_timeout_s", 20}, {"exit_barrier_timeout_s", 20}}}};
    if (!require.empty()) fabric["require"] = require;
    launcher["fabric"] = fabric;
    nlohmann::json config = {{"compute", {{"node_count", fixtures_.size()}}},
                             {"enable_baseten_workdir", false},
                             {"runtime", {{"start_commands", {kShowNccl}}}},
                             {"launcher", launcher}};
    config_ = dir_.Write("job.json", config.dump());
  }

  LaunchSpec Spec(int rank, const std::string& subcommand = "run", std::map<std::string, std::string> env = {}) const {
    LaunchSpec spec;
    spec.args = {subcommand, "--config", config_, "--root", dir_.path() + "/root"};
    spec.set_env = {{"BT_NODE_RANK", std::to_string(rank)}, {"BT_GROUP_SIZE", std::to_string(fixtures_.size())},
                    {"BT_LEADER_ADDR", "127.0.0.1"}, {"BT_RENDEZVOUS_TOKEN", "fabric-token"},
                    {"BT_SYSFS_ROOT", Tree(fixtures_[rank])}};
    for (auto& [name, value] : env) spec.set_env[name] = value;
    spec.timeout = 60s;
    return spec;
  }

  std::vector<ProcessResult> RunAll(const std::string& subcommand = "run", std::map<int, std::map<std::string, std::string>> env = {}) {
    std::vector<std::unique_ptr<LauncherProcess>> processes;
    for (size_t rank = 0; rank < fixtures_.size(); ++rank) {
      processes.push_back(std::make_unique<LauncherProcess>(Spec(int(rank), subcommand, env[int(rank)])));
    }
    std::vector<ProcessResult> results;
    for (auto& process : processes) results.push_back(process->Finish());
    return results;
  }

 private:
  TempDir dir_;
  std::vector<std::string> fixtures_;
  uint16_t port_;
  std::string config_;
};

constexpr const char* kEightRails = "HCA==mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1";

TEST(FabricJob, ConsistentNodesGetTheSameHcaListAndTheLeadersInterface) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b", "ib8-ndr-c"}, "").RunAll();
  for (const auto& result : results) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find(std::string(kEightRails) + " DISABLE=unset IFNAME==lo GLOO=lo"), std::string::npos) << result.out;
    EXPECT_NE(result.err.find("fabric: 8x InfiniBand 400 Gb/s (require = ib, NCCL uses RDMA)"), std::string::npos) << result.err;
    // Everything set is logged once, with its reason.
    EXPECT_NE(result.err.find("fabric: NCCL_IB_HCA==mlx5_0:1,"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("8 ACTIVE InfiniBand port(s) in PCI order, the same shape on all 3 nodes"), std::string::npos);
    EXPECT_EQ(result.err.find("fabric: NCCL_IB_HCA=="), result.err.rfind("fabric: NCCL_IB_HCA=="));
  }
}

TEST(FabricJob, RateMismatchFailsEveryNodeUnderIbWithTheTable) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b", "ib8-hdr"}, "ib").RunAll();
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_EQ(result.out.find("HCA="), std::string::npos) << "the training started: " << result.out;
    EXPECT_NE(result.err.find("the fabric differs between nodes (8 differences below)"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("rate Gb/s"), std::string::npos) << result.err;
  }
  // The table names the node, its host, the device, the value and the majority.
  EXPECT_NE(results[0].err.find("\n2     "), std::string::npos) << "no row starts with node 2: " << results[0].err;
  EXPECT_NE(results[0].err.find("mlx5_0         1     rate Gb/s                200                        400"),
            std::string::npos) << results[0].err;
}

TEST(FabricJob, RateMismatchStartsUnderAnyWithAWarning) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b", "ib8-hdr"}, "any").RunAll();
  for (const auto& result : results) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find(kEightRails), std::string::npos) << result.out;
    EXPECT_NE(result.err.find("the fabric differs between nodes (8 differences); launcher.fabric.require is \"any\""),
              std::string::npos) << result.err;
  }
  EXPECT_NE(results[0].err.find("fabric differences:"), std::string::npos) << results[0].err;
}

TEST(FabricJob, RailDownOnOneNodeIsNamedUnderIb) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-one-down", "ib8-ndr-c"}, "").RunAll();
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_NE(result.err.find("mlx5_3         1     port                     state DOWN/Polling"), std::string::npos)
        << result.err;
  }
}

TEST(FabricJob, NodeWithoutRdmaUnderEachPolicy) {
  const std::vector<std::string> fixtures = {"ib8-ndr-a", "ib8-ndr-b", "no-rdma"};
  for (const auto& result : FabricJob(fixtures, "").RunAll()) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_NE(result.err.find("link layer               none                       InfiniBand"), std::string::npos) << result.err;
  }
  for (const auto& result : FabricJob(fixtures, "any").RunAll()) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("HCA=unset DISABLE=1 IFNAME==lo"), std::string::npos) << result.out;
    EXPECT_NE(result.err.find("node 2 has no usable RDMA port: NCCL uses sockets (TCP) on every node"), std::string::npos)
        << result.err;
  }
  for (const auto& result : FabricJob(fixtures, "none").RunAll()) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("HCA=unset DISABLE=unset IFNAME==lo"), std::string::npos) << result.out;
  }
}

// Every scenario under every policy: ib refuses any difference, any and none start.
TEST(FabricJob, EveryScenarioUnderEveryPolicy) {
  struct Scenario {
    std::vector<std::string> fixtures;
    int exit_under_ib;
  };
  const std::vector<Scenario> scenarios = {{{"ib8-ndr-a", "ib8-ndr-b"}, 0},
                                           {{"ib8-ndr-a", "ib8-hdr"}, 69},
                                           {{"ib8-ndr-a", "ib8-one-down"}, 69},
                                           {{"ib8-ndr-a", "no-rdma"}, 69}};
  for (const Scenario& scenario : scenarios) {
    for (const std::string require : {"ib", "any", "none"}) {
      const int expected = require == "ib" ? scenario.exit_under_ib : 0;
      for (const auto& result : FabricJob(scenario.fixtures, require).RunAll()) {
        EXPECT_EQ(result.exit_code, expected) << scenario.fixtures[1] << " under " << require << ":\n" << result.err;
        EXPECT_EQ(result.out.find("HCA=") != std::string::npos, expected == 0) << result.out;
      }
    }
  }
}

TEST(FabricJob, InfiniBandWithoutASubnetManagerStopsEveryNodeUnderAutoNamingThePorts) {
  for (const auto& result : FabricJob({"ib8-no-sm", "ib8-no-sm"}, "").RunAll()) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_EQ(result.out.find("HCA="), std::string::npos) << "the training ran over sockets:\n" << result.out;
    EXPECT_NE(result.err.find("RDMA ports are present"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("state INIT/LinkUp: no subnet manager configured it"), std::string::npos) << result.err;
  }
}

// This host's first IPv4 address outside loopback, "" when it has none.
std::string RoutableAddress() {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* entry = list; entry != nullptr && found.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET) continue;
    const in_addr address = reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr;
    if ((ntohl(address.s_addr) >> 24) == 127) continue;
    char text[INET_ADDRSTRLEN];
    found = inet_ntop(AF_INET, &address, text, sizeof text);
  }
  freeifaddrs(list);
  return found;
}

// Node 0 reaches its own store over loopback (its name resolves to 127.0.1.1 on Debian)
// while node 1 reaches it over the host's routable address: both bootstrap over the latter.
TEST(FabricJob, ALeaderThatReachesItselfOverLoopbackBootstrapsWhereTheOthersReachIt) {
  const std::string address = RoutableAddress();
  if (address.empty()) GTEST_SKIP() << "this host has no IPv4 address outside loopback";
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b"}, "").RunAll("run", {{1, {{"BT_LEADER_ADDR", address}}}});
  ASSERT_EQ(results[1].exit_code, 0) << results[1].err;
  const size_t at = results[1].out.find("IFNAME==");
  ASSERT_NE(at, std::string::npos) << results[1].out;
  const std::string follower = results[1].out.substr(at, results[1].out.find(' ', at) - at);
  EXPECT_NE(follower, "IFNAME==lo");
  ASSERT_EQ(results[0].exit_code, 0) << results[0].err;
  EXPECT_NE(results[0].out.find(follower + " "), std::string::npos) << results[0].out << results[0].err;
}

TEST(FabricJob, AUserSetVariableIsKept) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b"}, "").RunAll("run", {{1, {{"NCCL_IB_HCA", "=mlx5_0:1"}}}});
  ASSERT_EQ(results[0].exit_code, 0) << results[0].err;
  EXPECT_NE(results[0].out.find(kEightRails), std::string::npos) << results[0].out;
  EXPECT_NE(results[1].out.find("HCA==mlx5_0:1 "), std::string::npos) << results[1].out;
  EXPECT_NE(results[1].err.find("NCCL_IB_HCA==mlx5_0:1 kept: set by the user"), std::string::npos) << results[1].err;
}

TEST(FabricJob, RendezvousSubcommandShowsTheFabricPerNodeAndTheTable) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-one-down"}, "any").RunAll("rendezvous");
  for (const auto& result : results) {
    ASSERT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.out.find("8x InfiniBand 400 Gb/s"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("7x InfiniBand 400 Gb/s"), std::string::npos) << result.out;
    EXPECT_NE(result.out.find("fabric differences:"), std::string::npos) << result.out;
  }
  results = FabricJob({"ib8-ndr-a", "ib8-one-down"}, "ib").RunAll("rendezvous");
  for (const auto& result : results) EXPECT_EQ(result.exit_code, 69) << result.err;
}

// The fixture trees have no real verbs devices behind them: the probe fails on them, as it
// would on a node whose sysfs shows HCAs the container cannot open.
TEST(RdmaProbe, AFailingPairNamesBothNodesBothDevicesAndTheVerbsCall) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b"}, "", {{"probe", "ring"}, {"probe_timeout_s", 2}}).RunAll();
  if (results[0].err.find("RDMA probe SKIPPED") != std::string::npos) GTEST_SKIP() << "built without the verbs plugin";
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_EQ(result.out.find("HCA="), std::string::npos) << "the training started";
    EXPECT_NE(result.err.find("fabric: RDMA probe failed:"), std::string::npos) << result.err;
    // ibv_get_device_list fails (ENOSYS) or lists nothing, depending on the kernel: both are named.
    const size_t line = result.err.find("0   <->1   3     mlx5_3:1 <-> mlx5_3:1          FAILED: node 0: bt_verbs_open on mlx5_3:1: ");
    ASSERT_NE(line, std::string::npos) << result.err;
    EXPECT_NE(result.err.substr(line, result.err.find('\n', line) - line).find("ibv_get_device_list"), std::string::npos);
    EXPECT_NE(result.err.find("node 1: bt_verbs_open on mlx5_3:1"), std::string::npos) << result.err;
  }
}

TEST(RdmaProbe, SkippedWithTheReasonWithoutRdma) {
  for (const auto& result : FabricJob({"no-rdma", "no-rdma"}, "any", {{"probe", "all-pairs"}}).RunAll()) {
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.err.find("RDMA probe SKIPPED: the fabric has no RDMA to probe"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("RDMA probe passed"), std::string::npos) << result.err;
  }
}

TEST(RdmaProbe, SkippedOnEveryNodeWhenOneCannotLoadTheVerbsPlugin) {
  auto results = FabricJob({"ib8-ndr-a", "ib8-ndr-b"}, "", {{"probe", "ring"}})
                     .RunAll("run", {{1, {{"BT_VERBS_PLUGIN", "/nonexistent/libbt_verbs.so"}}}});
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.err.find("RDMA probe SKIPPED: node 1: the verbs plugin cannot be loaded"), std::string::npos)
        << result.err;
  }
}

bool HasGpu() { return access("/dev/nvidia0", F_OK) == 0; }

TEST(NcclPreflight, SkippedOnEveryNodeWithTheReasonWithoutGpus) {
  if (HasGpu()) GTEST_SKIP() << "this host has a GPU: NcclPreflight.AllReduceOverEveryGpuOfTheNode runs instead";
  for (const auto& result : FabricJob({"no-rdma", "no-rdma"}, "", {{"nccl_preflight", true}, {"min_busbw_gbps", 100}}).RunAll()) {
    EXPECT_EQ(result.exit_code, 0) << result.err;
    EXPECT_NE(result.err.find("NCCL preflight SKIPPED: "), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("NCCL preflight passed"), std::string::npos) << result.err;
    EXPECT_NE(result.out.find("HCA="), std::string::npos) << "the training did not start";
  }
}

// Node 1's CUDA runtime fails as it loads. Node 0, waiting for node 1's GPU count, stops with
// node 1's reason as soon as node 1 reports it, not at its own preflight deadline.
TEST(NcclPreflight, ANodeWhoseWorkerDiesIsNamedOnEveryNodeAtOnce) {
  FabricJob job({"no-rdma", "no-rdma"}, "", {{"nccl_preflight", true}, {"preflight_timeout_s", 60}});
  auto results = job.RunAll("run", {{1, {{"LD_LIBRARY_PATH", BT_BROKEN_CUDA_DIR}, {"BT_TEST_CUDART", "exit"}}}});
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_EQ(result.out.find("HCA="), std::string::npos) << "the training started: " << result.out;
    EXPECT_NE(result.err.find("NCCL preflight: the worker exited without an answer"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("internal error"), std::string::npos) << result.err;
    EXPECT_LT(result.elapsed, 20s) << result.err;
  }
  EXPECT_NE(results[0].err.find("node 1 ("), std::string::npos) << results[0].err;
}

// A worker that never answers fails its node at launcher.fabric.preflight_timeout_s.
TEST(NcclPreflight, ANodeWhoseWorkerHangsFailsAtTheDeadline) {
  FabricJob job({"no-rdma", "no-rdma"}, "", {{"nccl_preflight", true}, {"preflight_timeout_s", 3}});
  auto results = job.RunAll("run", {{1, {{"LD_LIBRARY_PATH", BT_BROKEN_CUDA_DIR}}}});
  for (const auto& result : results) {
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_EQ(result.err.find("internal error"), std::string::npos) << result.err;
  }
  EXPECT_NE(results[1].err.find("NCCL preflight: no answer from the worker before launcher.fabric.preflight_timeout_s"),
            std::string::npos) << results[1].err;
}

// Both nodes wait on workers that never answer (timeout 60 s). Killing node 0 stops node 1
// within seconds with the leader named; SIGTERM stops a node at once with 143, and node 0
// ends with that code too (one result for the job), naming node 1.
TEST(NcclPreflight, ALostLeaderOrASigtermEndsAPreflightWaitAtOnce) {
  FabricJob job({"no-rdma", "no-rdma"}, "", {{"nccl_preflight", true}, {"preflight_timeout_s", 60}});
  const std::map<std::string, std::string> hanging = {{"LD_LIBRARY_PATH", BT_BROKEN_CUDA_DIR}};
  {
    LauncherProcess leader(job.Spec(0, "run", hanging));
    LauncherProcess follower(job.Spec(1, "run", hanging));
    ASSERT_TRUE(follower.WaitForLog("NCCL_IB_DISABLE=1", 20s));
    ASSERT_TRUE(leader.WaitForLog("NCCL_IB_DISABLE=1", 20s));
    leader.Signal(SIGKILL);
    const ProcessResult result = follower.Finish();
    EXPECT_EQ(result.exit_code, 69) << result.err;
    EXPECT_NE(result.err.find("leader (node 0) lost"), std::string::npos) << result.err;
    EXPECT_LT(result.elapsed, 30s) << result.err;
  }
  LauncherProcess leader(job.Spec(0, "run", hanging));
  LauncherProcess follower(job.Spec(1, "run", hanging));
  ASSERT_TRUE(follower.WaitForLog("NCCL_IB_DISABLE=1", 20s));
  follower.Signal(SIGTERM);
  const ProcessResult stopped = follower.Finish();
  EXPECT_EQ(stopped.exit_code, 143) << stopped.err;
  EXPECT_NE(stopped.err.find("stopped by Terminated before the start commands"), std::string::npos) << stopped.err;
  const ProcessResult told = leader.Finish();
  EXPECT_EQ(told.exit_code, 143) << told.err;
  EXPECT_NE(told.err.find("exiting with node 1's exit code 143"), std::string::npos) << told.err;
  EXPECT_LT(told.elapsed, 30s) << told.err;
}

// Hardware: one node, every GPU it has, the bus bandwidth logged.
TEST(NcclPreflight, AllReduceOverEveryGpuOfTheNode) {
  if (!HasGpu()) GTEST_SKIP() << "no GPU (/dev/nvidia0 absent)";
  LaunchSpec spec;
  TempDir dir;
  nlohmann::json config = {{"compute", {{"node_count", 1}}},
                           {"enable_baseten_workdir", false},
                           {"runtime", {{"start_commands", {"echo trained"}}}},
                           {"launcher", {{"fabric", {{"nccl_preflight", true}, {"preflight_bytes", 1 << 30}}}}}};
  spec.args = {"run", "--config", dir.Write("job.json", config.dump()), "--root", dir.path() + "/root"};
  spec.timeout = 180s;
  const ProcessResult result = RunLauncher(spec);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  if (access("/dev/nvidia1", F_OK) == 0) {
    EXPECT_NE(result.err.find("NCCL preflight passed"), std::string::npos) << result.err;
  } else {  // one GPU: the all-reduce runs, but no bandwidth exists to check
    EXPECT_NE(result.err.find("NCCL preflight: {\"algbw_gbps\""), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("bandwidth check SKIPPED: one GPU in the whole job"), std::string::npos) << result.err;
    EXPECT_EQ(result.err.find("NCCL preflight passed"), std::string::npos) << result.err;
  }
  EXPECT_NE(result.out.find("trained"), std::string::npos);
  std::cerr << result.err;
}

TEST(FabricCommand, JsonHasTheDevicesAndTheNcclEnvironment) {
  LaunchSpec spec;
  spec.args = {"fabric", "--sysfs-root", Tree("ib8-frontend"), "--format", "json"};
  const ProcessResult result = RunLauncher(spec);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  ASSERT_EQ(json.at("devices").size(), 9u);
  const auto& port = json["devices"][8]["ports"][0];
  EXPECT_EQ(json["devices"][8]["name"], "mlx5_bond_0");
  EXPECT_EQ(port.at("port"), 1);
  EXPECT_EQ(port.at("state"), "ACTIVE");
  EXPECT_EQ(port.at("link_layer"), "Ethernet");
  EXPECT_EQ(port.at("rate_gbps"), 200);
  EXPECT_EQ(json.at("nccl_env").at("NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
  EXPECT_EQ(json["nccl_env"].at("NCCL_SOCKET_IFNAME"), "=lo");
}

// The image's /etc/nccl.conf (beside the sysfs root: <tree>/etc/nccl.conf) chose HCAs and an
// interface: NCCL lets the environment beat the file, so bt-launch must not export its own.
TEST(FabricCommand, ValuesFromNcclsConfigFileAreKeptNotOverridden) {
  TempDir dir;
  std::filesystem::copy(std::string(BT_SOURCE_DIR) + "/tests/fixtures/fabric/ib8-frontend", dir.path(),
                        std::filesystem::copy_options::recursive | std::filesystem::copy_options::copy_symlinks);
  WriteFile(dir.path() + "/etc/nccl.conf", "# the image's defaults\nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\nNCCL_SOCKET_IFNAME==bond0\n");
  LaunchSpec spec;
  spec.args = {"fabric", "--sysfs-root", dir.path() + "/sys", "--format", "json"};
  spec.unset_env = {"NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_CONF_FILE"};
  spec.set_env = {{"HOME", dir.path()}};
  const ProcessResult result = RunLauncher(spec);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto json = nlohmann::json::parse(result.out);
  EXPECT_EQ(json.at("nccl_env").at("NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1") << json["nccl_env"].dump();
  EXPECT_EQ(json.at("nccl_env").at("NCCL_SOCKET_IFNAME"), "=bond0") << json["nccl_env"].dump();
}

TEST(FabricCommand, TextShowsEachPortAsIbstatWould) {
  LaunchSpec spec;
  spec.args = {"fabric", "--sysfs-root", Tree("roce-v2-a")};
  spec.set_env = {{"BT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2.18.3"}};
  const ProcessResult result = RunLauncher(spec);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_NE(result.out.find("mlx5_1         1    ACTIVE   LinkUp     400    Ethernet   0000:3c:00.0  gid[3] "
                            "0000:0000:0000:0000:0000:ffff:0a01:0007 RoCE v2 ens2f0np0"),
            std::string::npos) << result.out;
  EXPECT_NE(result.out.find("NCCL_IB_GID_INDEX=3"), std::string::npos) << result.out;  // NCCL 2.18 by its file name
}

}  // namespace
}  // namespace bt::testing
