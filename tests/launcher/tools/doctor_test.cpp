// `bt-launch doctor` through the real binary, each check made to fail the way it fails on
// a cluster: no leader, a wrong token, a skewed clock (libfaketime on the leader), a name
// that does not resolve, a 64 MiB /dev/shm (a tmpfs in a private mount namespace), GPUs
// missing, locked memory limited on an RDMA host, a destination that is not a directory.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/launcher_process.h"

namespace bt::testing {
namespace {

using namespace std::chrono_literals;
namespace fs = std::filesystem;

constexpr const char* kFakeTime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

struct Doctor {
  int exit_code;
  nlohmann::json findings;
  std::string err;

  // The finding of `check`; fails the test when there is none.
  nlohmann::json operator[](const std::string& check) const {
    for (const auto& finding : findings) {
      if (finding["check"] == check) return finding;
    }
    ADD_FAILURE() << "no finding for " << check << " in " << findings.dump(1);
    return {{"verdict", ""}, {"detail", ""}, {"fix", ""}};
  }
};

class DoctorTest : public ::testing::Test {
 protected:
  Doctor Run(std::vector<std::string> args, std::map<std::string, std::string> env = {},
             const std::string& binary = BT_LAUNCH_BINARY, std::vector<std::string> prefix = {}) {
    std::vector<std::string> argv = std::move(prefix);
    for (const char* word : {"doctor", "--format", "json", "--root"}) argv.push_back(word);
    argv.push_back(dir_.path() + "/root");
    argv.insert(argv.end(), args.begin(), args.end());
    env.try_emplace("BT_RENDEZVOUS_PORT", std::to_string(port_));
    ProcessResult result = RunLauncher({argv, env, {"BT_JOB_CONFIG", "CUDA_VISIBLE_DEVICES", "BT_SYSFS_ROOT"}}, binary);
    nlohmann::json parsed = nlohmann::json::parse(result.out, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << result.out << result.err;
    return {result.exit_code, parsed.is_discarded() ? nlohmann::json::array() : parsed["findings"], result.err};
  }

  std::vector<std::string> SecondNode() const { return {"--node-rank", "1", "--node-count", "2", "--leader-addr", "127.0.0.1"}; }

  // Node 0 serving the rendezvous for two nodes, as `bt-launch rendezvous --serve` does.
  LaunchSpec Leader(const std::string& token, std::map<std::string, std::string> env = {}) {
    env["BT_RENDEZVOUS_TOKEN"] = token;
    env["BT_RENDEZVOUS_PORT"] = std::to_string(port_);
    return {{"rendezvous", "--serve", "--node-count", "2", "--leader-addr", "127.0.0.1", "--root", dir_.path() + "/leader"},
            env, {"BT_JOB_CONFIG"}, std::nullopt, 60s};
  }

  TempDir dir_;
  uint16_t port_ = FreePort();
};

TEST_F(DoctorTest, ASingleNodeWithNothingWrongExitsZero) {
  Doctor doctor = Run({});
  EXPECT_EQ(doctor.exit_code, 0) << doctor.findings.dump(1);
  for (const char* check : {"config", "identity", "leader", "fabric", "/dev/shm", "memlock", "open files", "gpus", "scratch"}) {
    EXPECT_NE(doctor[check]["verdict"], "FAIL") << check;
  }
  EXPECT_EQ(doctor["leader"]["verdict"], "skip");
}

// The health phase's readings and findings (issue 30) over the fake NVML: a GPU with
// uncorrectable ECC errors fails the doctor naming it; the healthy one shows its readings.
TEST_F(DoctorTest, AGpuWithUncorrectableEccErrorsFailsNamingItsUuid) {
  const std::string state = dir_.path() + "/nvml";
  WriteFile(state, "gpus 2\ngpu 0 uuid GPU-healthy-0\ngpu 1 uuid GPU-broken-1\ngpu 1 ecc_uncorrected 4\n");
  Doctor doctor = Run({}, {{"BT_NVML_LIBRARY", BT_FAKE_NVML}, {"BT_FAKE_NVML_STATE", state}});
  EXPECT_EQ(doctor.exit_code, 1) << doctor.findings.dump(1);
  EXPECT_NE(doctor["gpu 0"]["detail"].get<std::string>().find("GPU-healthy-0"), std::string::npos);
  EXPECT_NE(doctor["gpu 0"]["detail"].get<std::string>().find("ECC uncorrected 0"), std::string::npos);
  const nlohmann::json health = doctor["gpu health"];
  EXPECT_EQ(health["verdict"], "FAIL") << health.dump();
  EXPECT_NE(health["detail"].get<std::string>().find("GPU-broken-1"), std::string::npos) << health.dump();
}

// Without NVML (a CPU node) under "auto": SKIPPED with the reason, never a failure.
TEST_F(DoctorTest, NoNvmlUnderAutoIsSkippedWithTheReason) {
  Doctor doctor = Run({}, {{"BT_NVML_LIBRARY", "/nonexistent/libnvidia-ml.so.1"}});
  EXPECT_EQ(doctor["gpu health"]["verdict"], "skip") << doctor.findings.dump(1);
  EXPECT_NE(doctor["gpu health"]["detail"].get<std::string>().find("NVML not available"), std::string::npos);
}

// `srun -N2 bt-launch doctor` before the job: node 0 serves nothing yet, which is no fault.
TEST_F(DoctorTest, ALeaderNotRunningYetIsAWarningWithTheFix) {
  Doctor doctor = Run(SecondNode(), {{"BT_RENDEZVOUS_TOKEN", "token-abcdef"}});
  EXPECT_EQ(doctor.exit_code, 0) << doctor.findings.dump(1);
  EXPECT_EQ(doctor["leader port"]["verdict"], "WARN");
  EXPECT_NE(doctor["leader port"]["detail"].get<std::string>().find("Connection refused"), std::string::npos);
  EXPECT_NE(doctor["leader port"]["detail"].get<std::string>().find("nothing serves yet"), std::string::npos);
  EXPECT_NE(doctor["leader port"]["fix"].get<std::string>().find("BT_RENDEZVOUS_PORT"), std::string::npos);
  EXPECT_EQ(doctor["clock skew"]["verdict"], "skip");
  EXPECT_EQ(doctor["leader name"]["verdict"], "WARN") << "loopback works for one host only";
}

TEST_F(DoctorTest, NodeZeroBeforeTheJobChecksThatItCanServeThePort) {
  Doctor free_port = Run({"--node-rank", "0", "--node-count", "2", "--leader-addr", "127.0.0.1"});
  EXPECT_EQ(free_port["leader port"]["verdict"], "ok") << free_port["leader port"].dump();

  // Another program holds the port (bound, not listening: connections are refused).
  int holder = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_port = htons(port_);
  ASSERT_EQ(bind(holder, reinterpret_cast<sockaddr*>(&any), sizeof any), 0);
  Doctor taken = Run({"--node-rank", "0", "--node-count", "2", "--leader-addr", "127.0.0.1"});
  close(holder);
  EXPECT_EQ(taken.exit_code, 1);
  EXPECT_EQ(taken["leader port"]["verdict"], "FAIL");
  EXPECT_NE(taken["leader port"]["detail"].get<std::string>().find("Address already in use"), std::string::npos);
}

TEST_F(DoctorTest, ARunningLeaderChecksTheTokenAndTheClock) {
  LauncherProcess leader(Leader("the-right-token"));
  ASSERT_TRUE(leader.WaitForLog("serving the rendezvous", 20s));

  Doctor right = Run(SecondNode(), {{"BT_RENDEZVOUS_TOKEN", "the-right-token"}});
  EXPECT_EQ(right.exit_code, 0) << right.findings.dump(1);
  EXPECT_EQ(right["leader port"]["verdict"], "ok");
  EXPECT_EQ(right["token"]["verdict"], "ok");
  EXPECT_EQ(right["clock skew"]["verdict"], "ok") << right["clock skew"].dump();

  Doctor wrong = Run(SecondNode(), {{"BT_RENDEZVOUS_TOKEN", "a-wrong-token"}});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_EQ(wrong["token"]["verdict"], "FAIL");
  EXPECT_NE(wrong["token"]["detail"].get<std::string>().find("wrong job token"), std::string::npos);
  EXPECT_EQ(wrong.err.find("a-wrong-token"), std::string::npos) << "a token value was logged";
  leader.Signal(SIGTERM);
  leader.Finish();
}

TEST_F(DoctorTest, ALeaderTenMinutesAheadIsAClockFailure) {
  if (access(kFakeTime, R_OK) != 0) GTEST_SKIP() << "SKIPPED: libfaketime (Debian's faketime) is not installed";
  LauncherProcess leader(Leader("tok-clock", {{"LD_PRELOAD", kFakeTime}, {"FAKETIME", "+600s"}, {"FAKETIME_DONT_FAKE_MONOTONIC", "1"}}));
  ASSERT_TRUE(leader.WaitForLog("serving the rendezvous", 20s));
  Doctor doctor = Run(SecondNode(), {{"BT_RENDEZVOUS_TOKEN", "tok-clock"}});
  leader.Signal(SIGTERM);
  leader.Finish();
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_EQ(doctor["clock skew"]["verdict"], "FAIL");
  const std::string detail = doctor["clock skew"]["detail"];
  EXPECT_NE(detail.find("behind the leader"), std::string::npos) << detail;
  const double seconds = std::stod(detail.substr(detail.find(" is ") + 4));
  EXPECT_NEAR(seconds, 600, 5) << detail;
}

TEST_F(DoctorTest, ALeaderNameThatDoesNotResolveFails) {
  Doctor doctor = Run({"--node-rank", "1", "--node-count", "2", "--leader-addr", "trainer-0.no-such-service.invalid"});
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_EQ(doctor["leader name"]["verdict"], "FAIL");
  EXPECT_NE(doctor["leader name"]["detail"].get<std::string>().find("does not resolve"), std::string::npos);
}

// The pod-1-points-at-itself mistake: a leader name that resolves to this host while this
// node is not rank 0 (each node would wait for itself).
TEST_F(DoctorTest, ALeaderAddressOfThisHostOnANonZeroRankIsAWarning) {
  std::string own_address;
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(getifaddrs(&interfaces), 0);
  for (ifaddrs* entry = interfaces; entry != nullptr && own_address.empty(); entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET || (entry->ifa_flags & IFF_LOOPBACK)) continue;
    char text[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof text);
    own_address = text;
  }
  freeifaddrs(interfaces);
  if (own_address.empty()) GTEST_SKIP() << "SKIPPED: this host has no non-loopback IPv4 address";
  Doctor doctor = Run({"--node-rank", "1", "--node-count", "2", "--leader-addr", own_address});
  EXPECT_EQ(doctor["leader name"]["verdict"], "WARN") << doctor["leader name"].dump();
  EXPECT_NE(doctor["leader name"]["detail"].get<std::string>().find("this node is rank 1"), std::string::npos);
}

// `run` on node 0 serves on its own host and reaches its store at the leader address:
// an address of another host fails it with 69, so doctor must not pass it.
TEST_F(DoctorTest, NodeZeroWithTheLeaderAddressOfAnotherHostFails) {
  Doctor doctor = Run({"--node-rank", "0", "--node-count", "2", "--leader-addr", "203.0.113.7"});
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_EQ(doctor["leader name"]["verdict"], "FAIL") << doctor["leader name"].dump();
  EXPECT_NE(doctor["leader name"]["detail"].get<std::string>().find("none of these is an address of this host"), std::string::npos);
  EXPECT_EQ(doctor["leader port"]["verdict"], "skip") << doctor["leader port"].dump();
}

TEST_F(DoctorTest, TheFabricCheckNamesPortsThatAreDownOrInit) {
  const std::string fixtures = std::string(BT_SOURCE_DIR) + "/tests/fixtures/fabric/";
  Doctor one_down = Run({"--sysfs-root", fixtures + "ib8-one-down/sys"});
  EXPECT_EQ(one_down["fabric"]["verdict"], "WARN") << one_down["fabric"].dump();
  EXPECT_NE(one_down["fabric"]["detail"].get<std::string>().find("mlx5_3:1 (state DOWN/Polling)"), std::string::npos)
      << one_down["fabric"].dump();

  // Two nodes without a subnet manager: `run` stops with 69, so doctor fails.
  Doctor no_sm = Run({"--sysfs-root", fixtures + "ib8-no-sm/sys", "--node-rank", "0", "--node-count", "2", "--leader-addr", "127.0.0.1"});
  EXPECT_EQ(no_sm["fabric"]["verdict"], "FAIL") << no_sm["fabric"].dump();
  EXPECT_NE(no_sm["fabric"]["detail"].get<std::string>().find("mlx5_0:1 (state INIT/LinkUp: no subnet manager configured it)"),
            std::string::npos) << no_sm["fabric"].dump();
}

// `run` stops with 65 on a malformed NCCL_IB_ADDR_*; doctor names it as the fabric's
// failure and still reports every other check.
TEST_F(DoctorTest, AMalformedNcclAddressRangeFailsTheFabricCheckAndTheReportGoesOn) {
  Doctor doctor = Run({}, {{"NCCL_IB_ADDR_RANGE", "10.0.0.0/99"}});
  EXPECT_EQ(doctor.exit_code, 1) << doctor.err;
  EXPECT_EQ(doctor["fabric"]["verdict"], "FAIL") << doctor["fabric"].dump();
  EXPECT_NE(doctor["fabric"]["detail"].get<std::string>().find("NCCL_IB_ADDR_RANGE"), std::string::npos)
      << doctor["fabric"].dump();
  EXPECT_EQ(doctor["scratch"]["verdict"], "ok") << doctor.findings.dump(1);
}

TEST_F(DoctorTest, CredentialsInTheDestinationUriAreNeverPrinted) {
  const std::string config = dir_.Write("job.json", R"({"runtime": {"checkpointing_config": {"enabled": true}},
      "launcher": {"checkpoint": {"destination": "s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix"}}})");
  Doctor doctor = Run({"--config", config});
  EXPECT_EQ(doctor.findings.dump().find("wJalrXUtnFEMI"), std::string::npos) << doctor.findings.dump(1);
  EXPECT_EQ(doctor.err.find("wJalrXUtnFEMI"), std::string::npos) << doctor.err;
  EXPECT_EQ(doctor["destination"]["verdict"], "FAIL");
  EXPECT_NE(doctor["destination"]["detail"].get<std::string>().find("s3://***@bucket/prefix"), std::string::npos)
      << doctor["destination"].dump();
}

TEST_F(DoctorTest, ABadConfigNamesTheFieldAndStops) {
  Doctor doctor = Run({"--config", dir_.Write("bad.json", R"({"compute": {"node_count": "two"}})")});
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_EQ(doctor["config"]["verdict"], "FAIL");
  EXPECT_NE(doctor["config"]["detail"].get<std::string>().find("compute.node_count"), std::string::npos);
  EXPECT_EQ(doctor.findings.size(), 1u) << "nothing else can be checked without a config";
}

TEST_F(DoctorTest, ADestinationThatIsNotADirectoryFails) {
  const std::string file = dir_.Write("a-file", "x");
  const std::string config = dir_.Write("job.json", R"({"runtime": {"checkpointing_config": {"enabled": true}},
      "launcher": {"checkpoint": {"destination": "file://)" + file + R"(/checkpoints"}}})");
  Doctor doctor = Run({"--config", config});
  EXPECT_EQ(doctor.exit_code, 1);
  EXPECT_EQ(doctor["destination"]["verdict"], "FAIL");
  EXPECT_NE(doctor["destination"]["detail"].get<std::string>().find("is not a directory"), std::string::npos);
  EXPECT_EQ(doctor["checkpoints"]["verdict"], "ok") << "BT_CHECKPOINT_DIR is under --root";
}

TEST_F(DoctorTest, SixtyFourMebibytesOfSharedMemoryFailAMultiGpuJob) {
  if (geteuid() != 0) GTEST_SKIP() << "SKIPPED: mounting a tmpfs needs root";
  const std::string config = dir_.Write("job.json", R"({"compute": {"accelerator": "H100:8"}})");
  // Docker's default: a 64 MiB tmpfs, here in a mount namespace of the doctor's own.
  const std::string script = "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec \"$0\" \"$@\"";
  Doctor doctor = Run({"--config", config}, {}, "/usr/bin/unshare", {"--mount", "sh", "-c", script, BT_LAUNCH_BINARY});
  if (doctor.findings.empty()) GTEST_SKIP() << "SKIPPED: cannot mount a tmpfs here: " << doctor.err;
  EXPECT_EQ(doctor["/dev/shm"]["verdict"], "FAIL");
  EXPECT_EQ(doctor["/dev/shm"]["detail"].get<std::string>().rfind("64.0 MiB (", 0), 0u) << doctor["/dev/shm"].dump();
  EXPECT_NE(doctor["/dev/shm"]["fix"].get<std::string>().find("--shm-size"), std::string::npos);
}

TEST_F(DoctorTest, GpusFewerThanTheAcceleratorCountFail) {
  const std::string sys = dir_.path() + "/host/sys";
  fs::create_directories(sys);
  for (int gpu = 0; gpu < 4; ++gpu) WriteFile(dir_.path() + "/host/dev/nvidia" + std::to_string(gpu));
  WriteFile(dir_.path() + "/host/dev/nvidiactl");  // not a GPU
  const std::string eight = dir_.Write("eight.json", R"({"compute": {"accelerator": "H100:8"}})");
  Doctor missing = Run({"--config", eight, "--sysfs-root", sys});
  EXPECT_EQ(missing["gpus"]["verdict"], "FAIL");
  EXPECT_NE(missing["gpus"]["detail"].get<std::string>().find("4 in "), std::string::npos) << missing["gpus"].dump();

  const std::string four = dir_.Write("four.json", R"({"compute": {"accelerator": "H100:4"}})");
  EXPECT_EQ(Run({"--config", four, "--sysfs-root", sys})["gpus"]["verdict"], "ok");
  Doctor hidden = Run({"--config", four, "--sysfs-root", sys}, {{"CUDA_VISIBLE_DEVICES", "0,1"}});
  EXPECT_EQ(hidden["gpus"]["verdict"], "FAIL");
  EXPECT_NE(hidden["gpus"]["fix"].get<std::string>().find("CUDA_VISIBLE_DEVICES"), std::string::npos);
}

TEST_F(DoctorTest, LimitedLockedMemoryFailsOnAnRdmaHost) {
  const std::string rdma = std::string(BT_SOURCE_DIR) + "/tests/fixtures/fabric/ib8-ndr-a/sys";
  Doctor doctor = Run({"--sysfs-root", rdma}, {}, "/usr/bin/prlimit", {"--memlock=65536:65536", BT_LAUNCH_BINARY});
  EXPECT_EQ(doctor["memlock"]["verdict"], "FAIL") << doctor["memlock"].dump();
  EXPECT_NE(doctor["memlock"]["detail"].get<std::string>().find("ibv_reg_mr"), std::string::npos);
  EXPECT_NE(doctor["fabric"]["detail"].get<std::string>().find("InfiniBand"), std::string::npos) << doctor["fabric"].dump();

  Doctor no_rdma = Run({}, {}, "/usr/bin/prlimit", {"--memlock=65536:65536", BT_LAUNCH_BINARY});
  EXPECT_EQ(no_rdma["memlock"]["verdict"], "ok") << "locked memory matters only with RDMA";
}

}  // namespace
}  // namespace bt::testing
