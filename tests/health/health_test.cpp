// Node health (issue 30, point 1) over the fake NVML the tests build (tests/health/fake_nvml.c,
// driven by the state file BT_FAKE_NVML_STATE names) and a copy of the sysfs fixture
// tests/fixtures/health/ib2-counters: each finding's severity and the GPU it names, SKIPPED
// for what the library lacks, Xid events while a reader waits, ports going down.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

#include "launcher/health/findings.h"
#include "launcher/health/gpu_checks.h"
#include "launcher/health/nvml.h"
#include "launcher/health/ports.h"
#include "launcher/health/xid.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/fabric/plan.h"

namespace bt::launcher::health {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// The fake's default identity of GPU `index` (fake_nvml.c: default_gpu).
std::string DefaultUuid(int index) {
  char uuid[64];
  std::snprintf(uuid, sizeof uuid, "GPU-00000000-0000-0000-0000-0000000000%02d", index);
  return uuid;
}

std::string DefaultPci(int index) {
  char pci[32];
  std::snprintf(pci, sizeof pci, "00000000:%02X:00.0", unsigned(index + 0x10));
  return pci;
}

// Replaces `path` at once (temporary + rename): the fake must never read half a file.
void WriteAtomically(const fs::path& path, const std::string& text) {
  const fs::path temporary = path.string() + ".tmp";
  std::ofstream(temporary) << text;
  fs::rename(temporary, path);
}

std::vector<Finding> OnGpu(const std::vector<Finding>& findings, int gpu) {
  std::vector<Finding> selected;
  for (const Finding& finding : findings) {
    if (finding.gpu == gpu) selected.push_back(finding);
  }
  return selected;
}

std::vector<Finding> NotSkipped(const std::vector<Finding>& findings) {
  std::vector<Finding> selected;
  for (const Finding& finding : findings) {
    if (finding.severity != Severity::kSkipped) selected.push_back(finding);
  }
  return selected;
}

std::string Describe(const std::vector<Finding>& findings) { return FormatFindingsTable({{0, "test", findings}}); }

class HealthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    directory_ = fs::temp_directory_path() / ("bt-health-" + std::to_string(getpid()) + "-" +
                                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(directory_);
    fs::create_directories(directory_);
    state_ = directory_ / "nvml-state";
    setenv("BT_FAKE_NVML_STATE", state_.c_str(), 1);
  }

  void TearDown() override {
    unsetenv("BT_FAKE_NVML_STATE");
    fs::remove_all(directory_);
  }

  // Eight healthy GPUs with 18 NVLinks up, then `extra` lines.
  void WriteState(const std::string& extra) {
    std::string text = "driver 550.54.15\ngpus 8\n";
    for (int i = 0; i < 8; ++i) text += "gpu " + std::to_string(i) + " nvlink 111111111111111111\n";
    WriteAtomically(state_, text + extra);
  }

  std::unique_ptr<Nvml> OpenFake(const char* library = BT_FAKE_NVML) {
    std::string error;
    std::unique_ptr<Nvml> nvml = Nvml::Open(library, error);
    EXPECT_NE(nvml, nullptr) << error;
    return nvml;
  }

  NodeSample Sample(const std::string& extra, std::optional<unsigned> expected = 8) {
    WriteState(extra);
    std::unique_ptr<Nvml> nvml = OpenFake();
    if (nvml == nullptr) return {};
    return SampleGpus(*nvml, expected);
  }

  fs::path directory_;
  fs::path state_;
};

TEST_F(HealthTest, HealthyNodeHasNoFindingAndItsReadings) {
  const NodeSample sample = Sample("");
  EXPECT_TRUE(sample.findings.empty()) << Describe(sample.findings);
  EXPECT_EQ(sample.driver_version, "550.54.15");
  ASSERT_EQ(sample.gpu_count, 8u);
  ASSERT_EQ(sample.gpus.size(), 8u);
  const GpuReadings& gpu = sample.gpus[5];
  EXPECT_EQ(gpu.uuid, DefaultUuid(5));
  EXPECT_EQ(gpu.pci_bus_id, DefaultPci(5));
  EXPECT_EQ(gpu.ecc_uncorrected_volatile, 0u);
  EXPECT_EQ(gpu.remap_pending, false);
  EXPECT_EQ(gpu.pcie_max_width, 16u);
  EXPECT_EQ(gpu.nvlinks, 18);
  EXPECT_EQ(gpu.nvlinks_up, 18);
}

TEST_F(HealthTest, FewerGpusThanExpectedIsFatal) {
  const NodeSample sample = Sample("gpus 7\n", 8);
  ASSERT_EQ(sample.findings.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(sample.findings[0].severity, Severity::kFatal);
  EXPECT_EQ(sample.findings[0].what, "fewer GPUs than expected");
  EXPECT_EQ(sample.findings[0].value, "7 of 8");
  EXPECT_TRUE(Sample("gpus 7\n", 7).findings.empty());
  EXPECT_TRUE(Sample("gpus 7\n", std::nullopt).findings.empty());
}

TEST_F(HealthTest, GpuLostAfterOpeningIsFatalWithItsIdentity) {
  const NodeSample sample = Sample("gpu 3 lost 2\n");
  const std::vector<Finding> findings = NotSkipped(sample.findings);
  ASSERT_EQ(findings.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(findings[0].severity, Severity::kFatal);
  EXPECT_EQ(findings[0].gpu, 3);
  EXPECT_EQ(findings[0].uuid, DefaultUuid(3));
  EXPECT_EQ(findings[0].pci_bus_id, DefaultPci(3));
  EXPECT_EQ(findings[0].what, "GPU lost (NVML_ERROR_GPU_IS_LOST)");
  EXPECT_TRUE(sample.gpus[3].lost);
  EXPECT_FALSE(sample.gpus[2].lost);
}

TEST_F(HealthTest, GpuLostAtItsHandleIsFatal) {
  const NodeSample sample = Sample("gpu 6 lost 1\n");
  ASSERT_EQ(sample.findings.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(sample.findings[0].severity, Severity::kFatal);
  EXPECT_EQ(sample.findings[0].gpu, 6);
  EXPECT_EQ(sample.findings[0].value, "nvmlDeviceGetHandleByIndex_v2");
}

TEST_F(HealthTest, UncorrectableEccIsFatal) {
  const NodeSample sample = Sample("gpu 2 ecc_uncorrected 4\n");
  ASSERT_EQ(sample.findings.size(), 1u) << Describe(sample.findings);
  const Finding& finding = sample.findings[0];
  EXPECT_EQ(finding.severity, Severity::kFatal);
  EXPECT_EQ(finding.gpu, 2);
  EXPECT_EQ(finding.uuid, DefaultUuid(2));
  EXPECT_EQ(finding.pci_bus_id, DefaultPci(2));
  EXPECT_EQ(finding.value, "4");
  EXPECT_NE(finding.what.find("uncorrectable ECC"), std::string::npos);
}

TEST_F(HealthTest, RowRemappingPendingOrFailedIsFatal) {
  const NodeSample sample = Sample("gpu 1 remap 1 0\ngpu 4 remap 0 1\n");
  const std::vector<Finding> pending = OnGpu(sample.findings, 1);
  const std::vector<Finding> failed = OnGpu(sample.findings, 4);
  ASSERT_EQ(pending.size(), 1u) << Describe(sample.findings);
  ASSERT_EQ(failed.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(pending[0].severity, Severity::kFatal);
  EXPECT_EQ(pending[0].what, "row remapping pending");
  EXPECT_EQ(failed[0].severity, Severity::kFatal);
  EXPECT_EQ(failed[0].what, "row remapping failed");
  EXPECT_EQ(failed[0].uuid, DefaultUuid(4));
  EXPECT_EQ(sample.findings.size(), 2u);
}

TEST_F(HealthTest, NvLinkThatExistsButIsDownIsFatal) {
  // GPU 0: link 4 down. GPU 7: a PCIe card, no NVLink at all (NOT_SUPPORTED): nothing to say.
  const NodeSample sample = Sample("gpu 0 nvlink 111101111111111111\ngpu 7 nvlink none\n");
  ASSERT_EQ(sample.findings.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(sample.findings[0].severity, Severity::kFatal);
  EXPECT_EQ(sample.findings[0].gpu, 0);
  EXPECT_EQ(sample.findings[0].uuid, DefaultUuid(0));
  EXPECT_EQ(sample.findings[0].value, "link 4 inactive (17 of 18 up)");
  EXPECT_EQ(sample.gpus[7].nvlinks, 0);
}

TEST_F(HealthTest, ClocksSlowedByTheHardwareIsAWarning) {
  // 0x40: HW thermal slowdown. 0x4 (SW power cap) on GPU 1 is the usual state of a busy GPU.
  const NodeSample sample = Sample("gpu 5 clocks_reasons 0x40\ngpu 1 clocks_reasons 0x4\n");
  ASSERT_EQ(sample.findings.size(), 1u) << Describe(sample.findings);
  EXPECT_EQ(sample.findings[0].severity, Severity::kWarning);
  EXPECT_EQ(sample.findings[0].gpu, 5);
  EXPECT_EQ(sample.findings[0].value, "HW thermal slowdown (0x40)");
  EXPECT_EQ(DescribeSlowdown(0x8 | 0x20 | 0x80), "HW slowdown, SW thermal slowdown, HW power brake");
}

TEST_F(HealthTest, PcieLinkBelowItsMaximumIsAWarning) {
  // GPU 2: half its lanes. GPU 3: Gen3 while busy. GPU 4: Gen1 while idle (power saving).
  const NodeSample sample =
      Sample("gpu 2 pcie 5 8 5 16\ngpu 3 pcie 3 16 5 16\ngpu 4 pcie 1 16 5 16\ngpu 4 clocks_reasons 0x1\n");
  const std::vector<Finding> findings = sample.findings;
  ASSERT_EQ(findings.size(), 2u) << Describe(findings);
  EXPECT_EQ(OnGpu(findings, 2).at(0).value, "Gen5 x8 (max Gen5 x16)");
  EXPECT_EQ(OnGpu(findings, 2).at(0).severity, Severity::kWarning);
  EXPECT_EQ(OnGpu(findings, 3).at(0).value, "Gen3 x16 (max Gen5 x16)");
  EXPECT_TRUE(OnGpu(findings, 4).empty());
}

TEST_F(HealthTest, MissingFunctionsAreSkippedNeverFatal) {
  // The state says ECC errors and a link down, but the library cannot tell.
  WriteState("gpu 2 ecc_uncorrected 4\ngpu 0 nvlink 0\n");
  std::unique_ptr<Nvml> nvml = OpenFake(BT_FAKE_NVML_MINIMAL);
  ASSERT_NE(nvml, nullptr);
  const NodeSample sample = SampleGpus(*nvml, 8);
  EXPECT_FALSE(HasFatal(sample.findings)) << Describe(sample.findings);
  EXPECT_TRUE(NotSkipped(sample.findings).empty()) << Describe(sample.findings);
  // One SKIPPED a check, not one a GPU: PCI id, ECC, remapping, clocks, PCIe, NVLink.
  EXPECT_EQ(sample.findings.size(), 6u) << Describe(sample.findings);
  EXPECT_EQ(sample.gpus.at(2).uuid, DefaultUuid(2));
  EXPECT_FALSE(sample.gpus.at(2).ecc_uncorrected_volatile.has_value());
  EXPECT_EQ(sample.driver_version, "");

  std::vector<Finding> reader_findings;
  EXPECT_EQ(XidReader::Open(*nvml, reader_findings), nullptr);
  ASSERT_EQ(reader_findings.size(), 1u);
  EXPECT_EQ(reader_findings[0].severity, Severity::kSkipped);
}

TEST_F(HealthTest, NoLibraryIsNvmlNotAvailableWithTheLoaderError) {
  const std::string missing = (directory_ / "no-such-dir" / "libnvidia-ml.so.1").string();
  std::string error;
  EXPECT_EQ(Nvml::Open(missing, error), nullptr);
  EXPECT_EQ(error.rfind("NVML not available: ", 0), 0u) << error;
  EXPECT_NE(error.find(missing), std::string::npos) << error;  // dlerror names the file
}

TEST_F(HealthTest, InitFailureIsNvmlNotAvailable) {
  WriteAtomically(state_, "init_error 9\n");
  std::string error;
  EXPECT_EQ(Nvml::Open(BT_FAKE_NVML, error), nullptr);
  EXPECT_EQ(error, "NVML not available: nvmlInit_v2: Driver Not Loaded");
}

TEST_F(HealthTest, LibraryFromTheEnvironment) {
  setenv("BT_NVML_LIBRARY", "/opt/nvidia/libnvidia-ml.so.1", 1);
  EXPECT_EQ(Nvml::DefaultLibrary(), "/opt/nvidia/libnvidia-ml.so.1");
  unsetenv("BT_NVML_LIBRARY");
  EXPECT_EQ(Nvml::DefaultLibrary(), "libnvidia-ml.so.1");
}

TEST_F(HealthTest, Xid79WrittenWhileTheReaderWaitsIsReturnedWithinTheWait) {
  WriteState("");
  std::unique_ptr<Nvml> nvml = OpenFake();
  ASSERT_NE(nvml, nullptr);
  std::vector<Finding> findings;
  std::unique_ptr<XidReader> reader = XidReader::Open(*nvml, findings);
  ASSERT_NE(reader, nullptr) << Describe(findings);
  EXPECT_EQ(reader->registered().size(), 8u);
  EXPECT_TRUE(reader->Wait(50).empty());  // nothing yet: a timeout

  std::thread writer([this] {
    std::this_thread::sleep_for(300ms);
    WriteState("xid 1 3 79\n");
  });
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Finding> events = reader->Wait(10000);
  const auto waited = std::chrono::steady_clock::now() - start;
  writer.join();
  ASSERT_EQ(events.size(), 1u);
  EXPECT_LT(waited, 5s);  // woken by the event, not the timeout
  EXPECT_EQ(events[0].severity, Severity::kFatal);
  EXPECT_EQ(events[0].xid, 79u);
  EXPECT_EQ(events[0].gpu, 3);
  EXPECT_EQ(events[0].uuid, DefaultUuid(3));
  EXPECT_EQ(events[0].pci_bus_id, DefaultPci(3));
  EXPECT_NE(events[0].what.find("fallen off the bus"), std::string::npos);
  EXPECT_TRUE(reader->Wait(50).empty());  // delivered once
}

TEST_F(HealthTest, Xid13IsAWarningAndQueuedEventsComeTogether) {
  WriteState("xid 1 0 13\nxid 2 6 31\n");
  std::unique_ptr<Nvml> nvml = OpenFake();
  ASSERT_NE(nvml, nullptr);
  std::vector<Finding> findings;
  std::unique_ptr<XidReader> reader = XidReader::Open(*nvml, findings);
  ASSERT_NE(reader, nullptr);
  const std::vector<Finding> events = reader->Wait(1000);
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0].severity, Severity::kWarning);
  EXPECT_EQ(events[0].xid, 13u);
  EXPECT_EQ(events[0].gpu, 0);
  EXPECT_EQ(events[1].xid, 31u);
  EXPECT_EQ(events[1].gpu, 6);
  EXPECT_FALSE(HasFatal(events));
}

TEST(XidClassification, ApplicationXidsAreWarningsTheRestFatal) {
  for (unsigned long long xid : {13, 31, 43, 45, 68, 109}) {
    EXPECT_EQ(ClassifyXid(xid).severity, Severity::kWarning) << xid;
    EXPECT_TRUE(IsApplicationXid(xid)) << xid;
  }
  for (unsigned long long xid : {48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140, 154, 999, 4242}) {
    const XidClass xid_class = ClassifyXid(xid);
    EXPECT_EQ(xid_class.severity, Severity::kFatal) << xid;
    EXPECT_FALSE(IsApplicationXid(xid)) << xid;
    EXPECT_FALSE(xid_class.fix.empty()) << xid;
  }
  EXPECT_NE(ClassifyXid(79).fix.find("reboot the node"), std::string::npos);
  EXPECT_NE(ClassifyXid(48).fix.find("reset the GPU"), std::string::npos);
  EXPECT_NE(ClassifyXid(64).fix.find("replace the GPU"), std::string::npos);
}

class PortsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    copy_ = fs::temp_directory_path() / ("bt-health-ports-" + std::to_string(getpid()));
    fs::remove_all(copy_);
    fs::copy(std::string(BT_SOURCE_DIR) + "/tests/fixtures/health/ib2-counters", copy_,
             fs::copy_options::recursive | fs::copy_options::copy_symlinks);
    sysfs_ = (copy_ / "sys").string();
  }

  void TearDown() override { fs::remove_all(copy_); }

  void WritePortFile(const std::string& device, const std::string& file, const std::string& text) {
    WriteAtomically(fs::path(sysfs_) / "class/infiniband" / device / "ports/1" / file, text + "\n");
  }

  // The ports the fabric plan selects on this fixture.
  std::vector<UsedPort> PlannedPorts() {
    const rendezvous::fabric::Inventory inventory = rendezvous::fabric::ReadInventory(sysfs_);
    return UsedPorts(rendezvous::fabric::SelectPorts(inventory), inventory);
  }

  fs::path copy_;
  std::string sysfs_;
};

TEST_F(PortsTest, UsedPortGoingDownIsFatal) {
  const std::vector<UsedPort> ports = PlannedPorts();
  ASSERT_EQ(ports.size(), 2u);
  EXPECT_EQ(ports[1].device, "mlx5_1");
  EXPECT_EQ(ports[1].pci_address, "0000:3c:00.0");
  const std::vector<PortCounters> baseline = ReadPortCounters(sysfs_, ports);
  EXPECT_TRUE(CheckPorts(sysfs_, baseline).findings.empty());

  WritePortFile("mlx5_1", "state", "1: DOWN");
  WritePortFile("mlx5_1", "phys_state", "2: Polling");
  const std::vector<Finding> findings = CheckPorts(sysfs_, baseline).findings;
  ASSERT_EQ(findings.size(), 1u) << Describe(findings);
  EXPECT_EQ(findings[0].severity, Severity::kFatal);
  EXPECT_EQ(findings[0].what, "mlx5_1 port 1 not ACTIVE/LinkUp");
  EXPECT_EQ(findings[0].value, "DOWN/Polling");
  EXPECT_EQ(findings[0].pci_bus_id, "0000:3c:00.0");
  EXPECT_EQ(findings[0].gpu, -1);
}

TEST_F(PortsTest, CounterGrowingSinceTheBaselineIsAWarningOnce) {
  const std::vector<PortCounters> baseline = ReadPortCounters(sysfs_, PlannedPorts());
  ASSERT_EQ(baseline.at(0).counters.size(), kWatchedPortCounters.size());
  WritePortFile("mlx5_0", "counters/link_downed", "2");
  WritePortFile("mlx5_0", "counters/port_rcv_errors", "9");  // not watched
  const PortCheck check = CheckPorts(sysfs_, baseline);
  ASSERT_EQ(check.findings.size(), 1u) << Describe(check.findings);
  EXPECT_EQ(check.findings[0].severity, Severity::kWarning);
  EXPECT_EQ(check.findings[0].what, "mlx5_0 port 1 link_downed growing");
  EXPECT_EQ(check.findings[0].value, "0 -> 2");
  // The counters read by that check are the next baseline: the same growth warns once.
  EXPECT_TRUE(CheckPorts(sysfs_, check.counters).findings.empty());
  WritePortFile("mlx5_0", "counters/symbol_error", "17");
  EXPECT_EQ(CheckPorts(sysfs_, check.counters).findings.size(), 1u);
}

TEST(FindingsFormat, JsonRoundTripAndTable) {
  const Finding finding{Severity::kFatal, 3, DefaultUuid(3), DefaultPci(3), "Xid 79: GPU has fallen off the bus", "79",
                        "reboot the node", 79};
  const NodeFindings node{1, "node-1.example", {finding}};
  const NodeFindings back = NodeFindings::FromJson(nlohmann::json::parse(node.ToJson().dump()));
  ASSERT_EQ(back.findings.size(), 1u);
  EXPECT_EQ(back.node, 1);
  EXPECT_EQ(back.host, "node-1.example");
  EXPECT_EQ(back.findings[0].severity, Severity::kFatal);
  EXPECT_EQ(back.findings[0].uuid, DefaultUuid(3));
  EXPECT_EQ(back.findings[0].xid, 79u);
  EXPECT_EQ(back.findings[0].fix, "reboot the node");

  const std::string table = FormatFindingsTable({node, {0, "node-0", {}}});
  EXPECT_NE(table.find("node-1.example"), std::string::npos) << table;
  EXPECT_NE(table.find("3 " + DefaultPci(3)), std::string::npos) << table;
  EXPECT_NE(table.find("fatal: Xid 79"), std::string::npos) << table;
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 2);  // the header and one row
  EXPECT_EQ(FormatFindingsTable({{0, "node-0", {}}}), "");

  nlohmann::json broken = node.ToJson();
  broken["findings"][0]["severity"] = "bad";
  EXPECT_THROW(NodeFindings::FromJson(broken), HealthError);
  broken = node.ToJson();
  broken["findings"][0].erase("gpu");
  EXPECT_THROW(NodeFindings::FromJson(broken), HealthError);
}

}  // namespace
}  // namespace bt::launcher::health
