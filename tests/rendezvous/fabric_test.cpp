// The fabric part of the rendezvous against the fixture trees in tests/fixtures/fabric:
// sysfs parsing, RoCE GID choice, the leader's plan under each policy, and golden NCCL
// environments.
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/fabric/nccl_env.h"
#include "rendezvous/fabric/nccl_library.h"
#include "rendezvous/fabric/plan.h"

namespace bt::rendezvous::fabric {
namespace {

namespace fs = std::filesystem;
using env::FabricRequirement;

std::string FixtureRoot(const std::string& name) { return std::string(BT_SOURCE_DIR) + "/tests/fixtures/fabric/" + name + "/sys"; }

// A fixture node that reached the leader through `interface`.
Inventory Fixture(const std::string& name, const std::string& interface = "eth0") {
  Inventory inventory = ReadInventory(FixtureRoot(name));
  inventory.bootstrap_interface = interface;
  return inventory;
}

const Port& FirstPort(const Inventory& inventory, const std::string& device) {
  for (const Device& candidate : inventory.devices) {
    if (candidate.name == device) return candidate.ports.at(0);
  }
  throw std::runtime_error("no device " + device);
}

std::map<std::string, std::string> Exported(const NcclEnvironment& environment) {
  std::map<std::string, std::string> exported;
  for (const auto& setting : environment.set) exported[setting.name] = setting.value;
  return exported;
}

VariableLookup LookupIn(const std::map<std::string, std::string>& values) {
  return [&values](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    return it == values.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
}

// The environment node `rank` gets from a plan over `nodes`, the plan made under the user's
// NCCL_IB_ADDR_* settings as node 0 makes it.
NcclEnvironment NcclFor(const std::vector<Inventory>& nodes, FabricRequirement require,
                        std::map<std::string, std::string> user = {}, std::optional<NcclVersion> version = std::nullopt,
                        size_t rank = 0) {
  std::vector<NodeFabric> fabric;
  for (size_t i = 0; i < nodes.size(); ++i) fabric.push_back({int(i), "host" + std::to_string(i), nodes[i]});
  const FabricPlan plan = PlanFabric(fabric, require, GidPreferencesFrom(LookupIn(user)));
  return ComputeNcclEnvironment(plan, plan.nodes.at(rank), nodes.at(rank), LookupIn(user), [&] { return version; });
}

FabricPlan Plan(const std::vector<std::string>& fixtures, FabricRequirement require) {
  std::vector<NodeFabric> nodes;
  for (size_t i = 0; i < fixtures.size(); ++i) nodes.push_back({int(i), "host" + std::to_string(i), Fixture(fixtures[i])});
  return PlanFabric(nodes, require);
}

TEST(FabricInventory, ReadsAnEightRailNdrNodeAsIbstatWould) {
  const Inventory inventory = Fixture("ib8-ndr-a");
  ASSERT_TRUE(inventory.infiniband_class);
  ASSERT_EQ(inventory.devices.size(), 8u);
  EXPECT_EQ(inventory.devices[0].pci_address, "0000:1a:00.0");
  EXPECT_EQ(inventory.devices[7].pci_address, "0000:dc:00.0");
  const Device& device = inventory.devices[0];
  EXPECT_EQ(device.name, "mlx5_0");
  EXPECT_EQ(device.hca_type, "MT4129");
  EXPECT_EQ(device.fw_ver, "28.41.1000");
  EXPECT_EQ(device.node_guid, "a088:c203:000d:58e8");
  EXPECT_EQ(device.numa_node, 0);
  EXPECT_EQ(inventory.devices[5].numa_node, 1);
  EXPECT_EQ(device.uverbs, "uverbs0");
  EXPECT_TRUE(device.uverbs_accessible);
  const Port& port = device.ports.at(0);
  EXPECT_EQ(port.number, 1);
  EXPECT_EQ(port.state, kPortActive);
  EXPECT_EQ(port.state_name, "ACTIVE");
  EXPECT_EQ(port.phys_state_name, "LinkUp");
  EXPECT_EQ(port.link_layer, "InfiniBand");
  EXPECT_EQ(port.rate_gbps, 400);
  EXPECT_EQ(port.lid, 0x31u);
  EXPECT_EQ(port.sm_lid, 1u);
  EXPECT_EQ(port.gid_table_length, 4);
  ASSERT_EQ(port.gids.size(), 1u);  // the zero GIDs are not kept
  EXPECT_EQ(port.SubnetPrefix(), "fe80:0000:0000:0000");
  EXPECT_TRUE(inventory.warnings.empty() || inventory.warnings[0].find("MEMLOCK") != std::string::npos);
}

TEST(FabricInventory, ValuesWithoutTrailingNewlineAndMissingFilesAreRead) {
  char pattern[] = "/tmp/bt-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const fs::path root = fs::path(pattern) / "sys";
  const fs::path port = root / "class/infiniband/ibp12s0/ports/1";
  fs::create_directories(port / "gids");
  auto write = [](const fs::path& path, const std::string& text) { std::ofstream(path) << text; };
  write(port / "state", "4: ACTIVE");  // as gpud's testdata stores it: no newline
  write(port / "phys_state", "5: LinkUp");
  write(port / "rate", "2.5 Gb/sec (1X SDR)");
  write(port / "lid", "0x31");
  write(port / "gids/0", "fe80:0000:0000:0000:a088:c203:000d:58e8\n");
  // no link_layer (libibumad's default: InfiniBand), no sm_lid, no gid_attrs, no device link
  const Inventory inventory = ReadInventory(root.string());
  ASSERT_EQ(inventory.devices.size(), 1u);
  const Port& read = inventory.devices[0].ports.at(0);
  EXPECT_EQ(read.state, kPortActive);
  EXPECT_EQ(read.rate_gbps, 2.5);
  EXPECT_EQ(read.link_layer, "InfiniBand");
  EXPECT_EQ(read.sm_lid, 0u);
  EXPECT_EQ(read.gids.at(0).type, "");
  EXPECT_EQ(inventory.devices[0].pci_address, "");
  EXPECT_FALSE(inventory.devices[0].uverbs_accessible);  // no verbs device names it
  ASSERT_FALSE(inventory.warnings.empty());
  EXPECT_NE(inventory.warnings[0].find("ibp12s0"), std::string::npos);
  fs::remove_all(pattern);
}

TEST(FabricInventory, AMissingDeviceNodeIsNamed) {
  char pattern[] = "/tmp/bt-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  fs::copy(fs::path(FixtureRoot("roce-v2-a")).parent_path(), pattern, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  fs::remove(fs::path(pattern) / "dev/infiniband/uverbs1");
  const Inventory inventory = ReadInventory(std::string(pattern) + "/sys");
  EXPECT_TRUE(inventory.devices[0].uverbs_accessible);
  EXPECT_FALSE(inventory.devices[1].uverbs_accessible);
  bool named = false;
  for (const auto& warning : inventory.warnings) named = named || warning.find("uverbs1 is missing") != std::string::npos;
  EXPECT_TRUE(named);
  EXPECT_EQ(SelectPorts(inventory).ports.size(), 1u);
  fs::remove_all(pattern);
}

TEST(FabricInventory, MemlockBelowUnlimitedIsAWarningWhenThereAreDevices) {
  rlimit saved{};
  getrlimit(RLIMIT_MEMLOCK, &saved);
  rlimit low{65536, saved.rlim_max};
  ASSERT_EQ(setrlimit(RLIMIT_MEMLOCK, &low), 0);
  const Inventory with_devices = Fixture("ib8-ndr-a");
  const Inventory without = Fixture("no-rdma");
  setrlimit(RLIMIT_MEMLOCK, &saved);
  EXPECT_EQ(with_devices.memlock, "65536");
  ASSERT_FALSE(with_devices.warnings.empty());
  EXPECT_NE(with_devices.warnings.back().find("RLIMIT_MEMLOCK is 65536 bytes, not unlimited"), std::string::npos);
  EXPECT_TRUE(without.warnings.empty());  // no RDMA here: nothing to register
}

// Section 5: every sysfs number is range-checked before use.
TEST(FabricInventory, StrayGidEntriesOfAMalformedTreeAreBoundedAndNamed) {
  char pattern[] = "/tmp/bt-sysfs-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  fs::copy(fs::path(FixtureRoot("roce-v2-a")).parent_path(), pattern, fs::copy_options::recursive | fs::copy_options::copy_symlinks);
  const fs::path ports = fs::path(pattern) / "sys/devices/pci0000:00/0000:1a:00.0/infiniband/mlx5_0/ports/1";
  std::ofstream(ports / "gids/2147483646") << "0000:0000:0000:0000:0000:0000:0000:0000\n";
  const fs::path second = fs::path(pattern) / "sys/devices/pci0000:00/0000:3c:00.0/infiniband/mlx5_1/ports/1";
  std::ofstream(second / "gids/2147483647") << "0000:0000:0000:0000:0000:0000:0000:0000\n";
  std::ofstream(second / "lid") << "0x1ffffffff\n";
  std::ofstream(second / "state") << "4294967300: ACTIVE\n";
  const auto started = std::chrono::steady_clock::now();
  const Inventory inventory = ReadInventory(std::string(pattern) + "/sys");
  const Selection selection = SelectPorts(inventory);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(2));
  EXPECT_EQ(inventory.devices.at(0).ports.at(0).gid_table_length, 16);
  EXPECT_EQ(inventory.devices.at(1).ports.at(0).gid_table_length, 16);
  EXPECT_EQ(inventory.devices.at(1).ports.at(0).lid, 0u);
  EXPECT_EQ(inventory.devices.at(1).ports.at(0).state, 0);  // out of range: no state, so not usable
  EXPECT_EQ(selection.ports.size(), 1u);
  int named = 0;
  for (const std::string& warning : inventory.warnings) {
    named += warning.find("gids/2147483646: entry number outside [0, 1024)") != std::string::npos;
    named += warning.find("gids/2147483647: entry number outside [0, 1024)") != std::string::npos;
  }
  EXPECT_EQ(named, 2);
  nlohmann::json published = inventory.ToJson();
  published["devices"][0]["ports"][0]["gid_table_length"] = 2147483647;
  EXPECT_THROW(Inventory::FromJson(published), InventoryError);
  fs::remove_all(pattern);
}

TEST(FabricInventory, NoClassDirectoryMeansNoRdma) {
  const Inventory inventory = Fixture("no-rdma");
  EXPECT_FALSE(inventory.infiniband_class);
  EXPECT_TRUE(inventory.devices.empty());
  EXPECT_EQ(SelectPorts(inventory).link_layer, "");
}

TEST(FabricInventory, JsonRoundTripsAndBadInputNamesTheField) {
  const Inventory inventory = Fixture("roce-v2-a");
  const Inventory back = Inventory::FromJson(inventory.ToJson());
  EXPECT_EQ(back.ToJson(), inventory.ToJson());
  nlohmann::json broken = inventory.ToJson();
  broken["devices"][1]["ports"][0]["rate_gbps"] = "fast";
  try {
    Inventory::FromJson(broken);
    FAIL() << "accepted a bad rate";
  } catch (const InventoryError& error) {
    EXPECT_STREQ(error.what(), "devices[1].ports[0].rate_gbps: wrong type");
  }
  broken = inventory.ToJson();
  broken.erase("devices");
  EXPECT_THROW(Inventory::FromJson(broken), InventoryError);
}

TEST(FabricGid, PicksTheRoceV2Ipv4EntryAsNcclDoes) {
  const Inventory inventory = Fixture("roce-v2-a");
  const Port& port = FirstPort(inventory, "mlx5_0");
  EXPECT_EQ(SelectGidIndex(port, GidPreferences{}), 3);  // 0 -> 2 (first IPv4) -> 3 (RoCE v2)
  EXPECT_EQ(SelectGidIndex(port, GidPreferences::FromLookup(std::nullopt, std::string("1"), std::nullopt)), 2);
  EXPECT_EQ(SelectGidIndex(port, GidPreferences::FromLookup(std::string("AF_INET6"), std::nullopt, std::nullopt)), 0);
}

TEST(FabricGid, AddressRangeChoosesBetweenSeveralIpv4Gids) {
  const Inventory inventory = Fixture("roce-v2-vlan");
  const Port& port = FirstPort(inventory, "mlx5_0");
  EXPECT_EQ(SelectGidIndex(port, GidPreferences{}), 3);  // the VLAN's address comes first
  EXPECT_EQ(SelectGidIndex(port, GidPreferences::FromLookup(std::nullopt, std::nullopt, std::string("10.0.0.0/8"))), 5);
  EXPECT_THROW(GidPreferences::FromLookup(std::string("inet"), std::nullopt, std::nullopt), std::invalid_argument);
  EXPECT_THROW(GidPreferences::FromLookup(std::nullopt, std::nullopt, std::string("10.0.0.0")), std::invalid_argument);
  EXPECT_THROW(GidPreferences::FromLookup(std::nullopt, std::nullopt, std::string("10.0.0.0/33")), std::invalid_argument);
}

// Golden NCCL environments, one per fixture.
TEST(FabricNcclEnv, EightRailNdr) {
  EXPECT_EQ(Exported(NcclFor({Fixture("ib8-ndr-a"), Fixture("ib8-ndr-b")}, FabricRequirement::kAuto)),
            (std::map<std::string, std::string>{
                {"NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1"},
                {"NCCL_SOCKET_IFNAME", "=eth0"},
                {"GLOO_SOCKET_IFNAME", "eth0"}}));
}

TEST(FabricNcclEnv, FrontEndEthernetNicIsLeftOut) {
  const NcclEnvironment environment = NcclFor({Fixture("ib8-frontend")}, FabricRequirement::kAuto);
  EXPECT_EQ(Exported(environment).at("NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
  EXPECT_NE(environment.set[2].reason.find("mlx5_bond_0:1 (Ethernet beside InfiniBand)"), std::string::npos);
}

TEST(FabricNcclEnv, PortDownIsLeftOut) {
  EXPECT_EQ(Exported(NcclFor({Fixture("ib8-one-down")}, FabricRequirement::kAuto)).at("NCCL_IB_HCA"),
            "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
}

TEST(FabricNcclEnv, RoceOnCurrentNcclLeavesTheGidIndexToNccl) {
  EXPECT_EQ(Exported(NcclFor({Fixture("roce-v2-a"), Fixture("roce-v2-b")}, FabricRequirement::kAuto, {},
                             NcclVersion{2, 21, 5})),
            (std::map<std::string, std::string>{{"NCCL_IB_HCA", "=mlx5_0:1,mlx5_1:1"},
                                                {"NCCL_SOCKET_IFNAME", "=eth0"},
                                                {"GLOO_SOCKET_IFNAME", "eth0"}}));
}

TEST(FabricNcclEnv, RoceOnNcclBefore221GetsTheIndexNcclWouldChoose) {
  auto exported = Exported(NcclFor({Fixture("roce-v2-a")}, FabricRequirement::kAuto, {}, NcclVersion{2, 18, 3}));
  EXPECT_EQ(exported.at("NCCL_IB_GID_INDEX"), "3");
  exported = Exported(NcclFor({Fixture("roce-v2-vlan")}, FabricRequirement::kAuto, {{"NCCL_IB_ADDR_RANGE", "10.0.0.0/8"}},
                              NcclVersion{2, 20, 5}));
  EXPECT_EQ(exported.at("NCCL_IB_GID_INDEX"), "5");
  EXPECT_FALSE(Exported(NcclFor({Fixture("roce-v2-a")}, FabricRequirement::kAuto)).count("NCCL_IB_GID_INDEX"));  // no NCCL found
}

TEST(FabricNcclEnv, LinkWithoutSubnetManagerFallsBackToSocketsOnlyUnderAny) {
  const NcclEnvironment environment = NcclFor({Fixture("ib8-no-sm")}, FabricRequirement::kAny);
  EXPECT_EQ(Exported(environment).at("NCCL_IB_DISABLE"), "1");
  EXPECT_FALSE(Exported(environment).count("NCCL_IB_HCA"));
}

// Section 1: a fabric that could do RDMA never silently runs NCCL over TCP.
TEST(FabricSilentSockets, IpV6OnlyRoceIsSelectedWithTheJobsAddressFamily) {
  const std::map<std::string, std::string> user = {{"NCCL_IB_ADDR_FAMILY", "AF_INET6"}};
  const NcclEnvironment environment =
      NcclFor({Fixture("roce-v2-ipv6-a"), Fixture("roce-v2-ipv6-b")}, FabricRequirement::kAuto, user, NcclVersion{2, 18, 3});
  const auto exported = Exported(environment);
  EXPECT_FALSE(exported.count("NCCL_IB_DISABLE"));
  EXPECT_EQ(exported.at("NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1");
  EXPECT_EQ(exported.at("NCCL_IB_GID_INDEX"), "3");  // 0 (fe80 v1) -> 3 (2001:db8:: RoCE v2)
  std::vector<NodeFabric> nodes = {{0, "a", Fixture("roce-v2-ipv6-a")}, {1, "b", Fixture("roce-v2-ipv6-b")}};
  const FabricPlan plan = PlanFabric(nodes, FabricRequirement::kAuto, GidPreferencesFrom(LookupIn(user)));
  EXPECT_TRUE(plan.ok) << plan.failure << "\n" << FormatMismatches(plan.mismatches);
  EXPECT_TRUE(plan.use_rdma);
  EXPECT_EQ(plan.nodes[1].selection.ports.at(0).gid_index, 3);
}

TEST(FabricSilentSockets, IpV6OnlyRoceUnderTheDefaultFamilyFailsNamingTheFix) {
  // NCCL's default AF_INET would take GID 0, the link-local one: the ports cannot route.
  const FabricPlan plan = Plan({"roce-v2-ipv6-a", "roce-v2-ipv6-b"}, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  EXPECT_FALSE(plan.use_rdma);
  const std::string table = FormatMismatches(plan.mismatches);
  EXPECT_NE(plan.failure.find("RDMA ports are present"), std::string::npos) << plan.failure;
  EXPECT_NE(table.find("no RoCE v2 IPv4 GID (it has RoCE v2 IPv6 GIDs: NCCL_IB_ADDR_FAMILY=AF_INET6)"), std::string::npos)
      << table;
}

TEST(FabricSilentSockets, InfiniBandWithoutASubnetManagerFailsUnderAutoNamingEveryPort) {
  const FabricPlan plan = Plan({"ib8-no-sm", "ib8-no-sm"}, FabricRequirement::kAuto);
  EXPECT_EQ(plan.policy, FabricRequirement::kIb);
  EXPECT_FALSE(plan.ok);
  EXPECT_FALSE(plan.use_rdma);
  EXPECT_NE(plan.failure.find("launcher.fabric.require is \"auto\""), std::string::npos) << plan.failure;
  int init_rows = 0;
  for (const Mismatch& row : plan.mismatches) init_rows += row.value.find("state INIT/LinkUp") != std::string::npos;
  EXPECT_EQ(init_rows, 16) << FormatMismatches(plan.mismatches);  // 8 ports on each of 2 nodes
}

TEST(FabricSilentSockets, UnusablePortsUnderAnyAreAWarningWithTheTable) {
  const FabricPlan plan = Plan({"ib8-no-sm", "ib8-no-sm"}, FabricRequirement::kAny);
  EXPECT_TRUE(plan.ok);
  EXPECT_FALSE(plan.use_rdma);
  ASSERT_EQ(plan.warnings.size(), 1u);
  EXPECT_NE(plan.warnings[0].find("RDMA ports are present (the table names them)"), std::string::npos) << plan.warnings[0];
  EXPECT_NE(FormatMismatches(plan.mismatches).find("mlx5_7"), std::string::npos);
}

TEST(FabricSilentSockets, OldNcclWithGidIndicesThatDifferBetweenPortsWarns) {
  const NcclEnvironment environment =
      NcclFor({Fixture("roce-v2-mixed-index"), Fixture("roce-v2-a")}, FabricRequirement::kAuto, {}, NcclVersion{2, 18, 3});
  EXPECT_FALSE(Exported(environment).count("NCCL_IB_GID_INDEX"));
  ASSERT_EQ(environment.warnings.size(), 1u);
  EXPECT_NE(environment.warnings[0].find("mlx5_0:1 at 3, mlx5_1:1 at 5"), std::string::npos) << environment.warnings[0];
  EXPECT_NE(environment.warnings[0].find("link-local"), std::string::npos);
}

TEST(FabricSilentSockets, OldNcclWithGidIndicesThatDifferBetweenNodesGetsEachNodesOwn) {
  // Each node exports its own index: NCCL_IB_GID_INDEX names a local GID.
  const std::vector<Inventory> nodes = {Fixture("roce-v2-vlan"), Fixture("roce-v2-a")};
  const std::map<std::string, std::string> user = {{"NCCL_IB_ADDR_RANGE", "10.0.0.0/8"}};
  EXPECT_EQ(Exported(NcclFor(nodes, FabricRequirement::kAny, user, NcclVersion{2, 18, 3}, 0)).at("NCCL_IB_GID_INDEX"), "5");
  EXPECT_EQ(Exported(NcclFor(nodes, FabricRequirement::kAny, user, NcclVersion{2, 18, 3}, 1)).at("NCCL_IB_GID_INDEX"), "3");
}

TEST(FabricSilentSockets, ALoopbackBootstrapInterfaceBesideRoutableOnesIsADifference) {
  // Node 0's own name resolves to 127.0.1.1 (Debian's /etc/hosts): it reached "the leader" over lo.
  Inventory leader = Fixture("ib8-ndr-a", "lo");
  leader.interfaces = {{"lo", true, true, {"127.0.0.1", "::1"}}, {"eth0", true, true, {"10.0.0.1"}}};
  Inventory follower = Fixture("ib8-ndr-b", "eth0");
  follower.interfaces = {{"lo", true, true, {"127.0.0.1"}}, {"eth0", true, true, {"10.0.0.2"}}};
  const FabricPlan plan = PlanFabric({{0, "a", leader}, {1, "b", follower}}, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  ASSERT_EQ(plan.mismatches.size(), 1u) << FormatMismatches(plan.mismatches);
  EXPECT_EQ(plan.mismatches[0].rank, 0);
  EXPECT_EQ(plan.mismatches[0].what, "bootstrap interface");
  EXPECT_EQ(plan.mismatches[0].value, "lo (loopback)");
  EXPECT_EQ(plan.mismatches[0].majority, "routable, as eth0 on node 1");
  // Every node on loopback is one host: nothing differs.
  follower.bootstrap_interface = "lo";
  EXPECT_TRUE(PlanFabric({{0, "a", leader}, {1, "b", follower}}, FabricRequirement::kAuto).ok);
}

// Section 2: what the user configured wins, and a conflict is said.
class NcclConfigFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/bt-nccl-conf-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    dir_ = pattern;
    fs::create_directories(dir_ / "home");
    fs::create_directories(dir_ / "etc");
  }
  void TearDown() override { fs::remove_all(dir_); }
  void Write(const std::string& relative, const std::string& text) { std::ofstream(dir_ / relative) << text; }
  NcclConfigFiles Read(std::map<std::string, std::string> job) {
    job.emplace("HOME", "/nonexistent");  // NCCL reads the passwd home, never $HOME
    return NcclConfigFiles::Read(LookupIn(job), (dir_ / "home").string(), (dir_ / "etc/nccl.conf").string());
  }
  fs::path dir_;
};

TEST_F(NcclConfigFileTest, ValuesInNcclConfigFilesAreTheUsersAndAreNotOverridden) {
  Write("etc/nccl.conf", "# site defaults\nNCCL_SOCKET_IFNAME==bond0  \nNCCL_IB_HCA==mlx5_0:1,mlx5_1:1\n");
  Write("home/.nccl.conf", "NCCL_IB_HCA==mlx5_2:1\n");
  const NcclConfigFiles files = Read({});
  EXPECT_EQ(files.Find("NCCL_IB_HCA"), "=mlx5_2:1");  // ~/.nccl.conf is read first and wins
  EXPECT_EQ(files.Find("NCCL_SOCKET_IFNAME"), "=bond0");
  EXPECT_EQ(files.SourceOf("NCCL_SOCKET_IFNAME"), (dir_ / "etc/nccl.conf").string());
  const std::vector<Inventory> nodes = {Fixture("ib8-ndr-a")};
  const FabricPlan plan = PlanFabric({{0, "a", nodes[0]}}, FabricRequirement::kAuto);
  auto user = [&files](const std::string& name) { return files.Find(name); };
  const NcclEnvironment environment = ComputeNcclEnvironment(plan, plan.nodes[0], nodes[0], user, [] { return std::nullopt; });
  const auto exported = Exported(environment);
  EXPECT_FALSE(exported.count("NCCL_IB_HCA"));
  EXPECT_FALSE(exported.count("NCCL_SOCKET_IFNAME"));
  EXPECT_EQ(environment.kept.size(), 2u);
}

TEST_F(NcclConfigFileTest, NcclConfFileReplacesTheHomeFile) {
  Write("home/.nccl.conf", "NCCL_IB_HCA=mlx5_9\n");
  Write("site.conf", "NCCL_IB_ADDR_FAMILY=AF_INET6\r\n");
  const NcclConfigFiles files = Read({{"NCCL_CONF_FILE", (dir_ / "site.conf").string()}});
  EXPECT_FALSE(files.Find("NCCL_IB_HCA"));
  EXPECT_EQ(files.Find("NCCL_IB_ADDR_FAMILY"), "AF_INET6");
  EXPECT_EQ(GidPreferencesFrom([&files](const std::string& name) { return files.Find(name); }).family, AF_INET6);
}

TEST_F(NcclConfigFileTest, AFifoOrAHugeMaskIsNoHangAndNoCrash) {
  // A FIFO with no writer: reading it would block the launcher past SIGTERM.
  ASSERT_EQ(mkfifo((dir_ / "fifo.conf").c_str(), 0600), 0);
  Write("etc/nccl.conf", "NCCL_IB_HCA=mlx5_0\n");
  const NcclConfigFiles files = Read({{"NCCL_CONF_FILE", (dir_ / "fifo.conf").string()}});
  EXPECT_EQ(files.Find("NCCL_IB_HCA"), "mlx5_0");
  // A mask too large for an int is a bad value, not an internal error.
  EXPECT_THROW(GidPreferences::FromLookup(std::nullopt, std::nullopt, "10.0.0.0/99999999999"), std::invalid_argument);
}

TEST(FabricUserSettings, IbDisableIsNotSetBesideTheUsersOwnHcas) {
  const NcclEnvironment environment =
      NcclFor({Fixture("ib8-ndr-a"), Fixture("no-rdma")}, FabricRequirement::kAny, {{"NCCL_IB_HCA", "=mlx5_0:1"}});
  EXPECT_FALSE(Exported(environment).count("NCCL_IB_DISABLE"));
  ASSERT_EQ(environment.warnings.size(), 1u);
  EXPECT_NE(environment.warnings[0].find("NCCL_IB_HCA==mlx5_0:1 is the user's"), std::string::npos) << environment.warnings[0];
}

TEST(FabricUserSettings, AnEmptyValueIsUnsetAsNcclReadsIt) {
  const NcclEnvironment environment = NcclFor({Fixture("ib8-frontend")}, FabricRequirement::kAuto,
                                              {{"NCCL_IB_HCA", ""}, {"NCCL_SOCKET_IFNAME", ""}, {"NCCL_IB_ADDR_FAMILY", ""}});
  const auto exported = Exported(environment);
  EXPECT_EQ(exported.at("NCCL_IB_HCA"), "=mlx5_0:1,mlx5_1:1,mlx5_2:1,mlx5_3:1,mlx5_4:1,mlx5_5:1,mlx5_6:1,mlx5_7:1");
  EXPECT_EQ(exported.at("NCCL_SOCKET_IFNAME"), "=eth0");
  EXPECT_TRUE(environment.kept.empty());
  EXPECT_TRUE(NcclTreatsAsUnset("NCCL_SOCKET_IFNAME", "^"));  // one character: ncclFindInterfaces ignores it
  EXPECT_FALSE(NcclTreatsAsUnset("NCCL_IB_HCA", "mlx5"));
}

TEST(FabricUserSettings, AllZeroNodeGuidsAreNotDuplicates) {
  // A virtual function nobody assigned a GUID reads "0000:0000:0000:0000" on every node.
  Inventory first = Fixture("ib8-ndr-a");
  Inventory second = Fixture("ib8-ndr-b");
  for (Inventory* inventory : {&first, &second}) {
    for (Device& device : inventory->devices) device.node_guid = "0000:0000:0000:0000";
  }
  const FabricPlan plan = PlanFabric({{0, "a", first}, {1, "b", second}}, FabricRequirement::kAuto);
  EXPECT_TRUE(plan.ok) << FormatMismatches(plan.mismatches);
  EXPECT_TRUE(plan.mismatches.empty());
}

TEST(FabricNcclEnv, NodeWithoutRdma) {
  EXPECT_EQ(Exported(NcclFor({Fixture("no-rdma")}, FabricRequirement::kAuto)),
            (std::map<std::string, std::string>{
                {"NCCL_IB_DISABLE", "1"}, {"NCCL_SOCKET_IFNAME", "=eth0"}, {"GLOO_SOCKET_IFNAME", "eth0"}}));
  EXPECT_EQ(Exported(NcclFor({Fixture("no-rdma")}, FabricRequirement::kNone)),
            (std::map<std::string, std::string>{{"NCCL_SOCKET_IFNAME", "=eth0"}, {"GLOO_SOCKET_IFNAME", "eth0"}}));
}

TEST(FabricNcclEnv, UserSetVariablesAreKept) {
  const NcclEnvironment environment = NcclFor({Fixture("ib8-ndr-a")}, FabricRequirement::kAuto,
                                              {{"NCCL_IB_HCA", "mlx5_0"}, {"NCCL_SOCKET_IFNAME", "^docker"}});
  const auto exported = Exported(environment);
  EXPECT_FALSE(exported.count("NCCL_IB_HCA"));
  EXPECT_FALSE(exported.count("NCCL_SOCKET_IFNAME"));
  EXPECT_EQ(exported.at("GLOO_SOCKET_IFNAME"), "eth0");
  ASSERT_EQ(environment.kept.size(), 2u);
  EXPECT_EQ(environment.kept[0].value, "^docker");
  EXPECT_EQ(environment.kept[1].value, "mlx5_0");
  EXPECT_NE(environment.kept[1].reason.find("=mlx5_0:1,mlx5_1:1"), std::string::npos);
}

TEST(FabricNcclEnv, BadUserGidVariableIsAnError) {
  EXPECT_THROW(NcclFor({Fixture("roce-v2-a")}, FabricRequirement::kAuto, {{"NCCL_IB_ADDR_FAMILY", "ipv4"}},
                       NcclVersion{2, 18, 3}),
               std::invalid_argument);
}

TEST(FabricNcclLibrary, VersionFromTheLibraryFileName) {
  char pattern[] = "/tmp/bt-nccl-XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const fs::path real = fs::path(pattern) / "libnccl.so.2.18.3";
  std::ofstream(real).put('\0');
  fs::create_symlink(real.filename(), fs::path(pattern) / "libnccl.so.2");
  const auto version = NcclVersionFromFileName((fs::path(pattern) / "libnccl.so.2").string());
  ASSERT_TRUE(version);
  EXPECT_EQ(version->Text(), "2.18.3");
  EXPECT_TRUE(version->Before(2, 21));
  EXPECT_FALSE((NcclVersion{2, 21, 0}).Before(2, 21));
  EXPECT_FALSE(NcclVersionFromFileName("/usr/lib/libnccl.so"));
  fs::remove_all(pattern);
}

// The leader's plan under each policy.
TEST(FabricPlan, ConsistentNodesPass) {
  const FabricPlan plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "ib8-ndr-c"}, FabricRequirement::kAuto);
  EXPECT_EQ(plan.policy, FabricRequirement::kIb);
  EXPECT_TRUE(plan.ok);
  EXPECT_TRUE(plan.use_rdma);
  EXPECT_TRUE(plan.mismatches.empty()) << FormatMismatches(plan.mismatches);
  EXPECT_EQ(plan.nodes[2].summary, "8x InfiniBand 400 Gb/s");
}

TEST(FabricPlan, RateMismatchFailsUnderIbAndWarnsUnderAny) {
  FabricPlan plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "ib8-hdr"}, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  ASSERT_EQ(plan.mismatches.size(), 8u);
  EXPECT_EQ(plan.mismatches[0].rank, 2);
  EXPECT_EQ(plan.mismatches[0].device, "mlx5_0");
  EXPECT_EQ(plan.mismatches[0].what, "rate Gb/s");
  EXPECT_EQ(plan.mismatches[0].value, "200");
  EXPECT_EQ(plan.mismatches[0].majority, "400");
  plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "ib8-hdr"}, FabricRequirement::kAny);
  EXPECT_TRUE(plan.ok);
  EXPECT_TRUE(plan.use_rdma);
  EXPECT_EQ(plan.warnings.size(), 1u);
}

TEST(FabricPlan, RailDownIsNamedWithItsDevice) {
  const FabricPlan plan = Plan({"ib8-ndr-a", "ib8-one-down", "ib8-ndr-c"}, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  const std::string table = FormatMismatches(plan.mismatches);
  EXPECT_NE(table.find("usable ports"), std::string::npos) << table;
  EXPECT_NE(table.find("mlx5_3"), std::string::npos) << table;
  EXPECT_NE(table.find("state DOWN/Polling"), std::string::npos) << table;
  // The rails after the down one shift: their subnet prefixes still agree (one subnet).
  for (const Mismatch& row : plan.mismatches) EXPECT_EQ(row.rank, 1) << table;
}

TEST(FabricPlan, NodeWithoutRdmaUnderEachPolicy) {
  FabricPlan plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "no-rdma"}, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  EXPECT_NE(FormatMismatches(plan.mismatches).find("link layer"), std::string::npos);
  plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "no-rdma"}, FabricRequirement::kAny);
  EXPECT_TRUE(plan.ok);
  EXPECT_FALSE(plan.use_rdma);
  ASSERT_FALSE(plan.warnings.empty());
  EXPECT_NE(plan.warnings[0].find("node 2 has no usable RDMA port"), std::string::npos) << plan.warnings[0];
  plan = Plan({"ib8-ndr-a", "ib8-ndr-b", "no-rdma"}, FabricRequirement::kNone);
  EXPECT_TRUE(plan.ok);
  EXPECT_FALSE(plan.checked());
  EXPECT_TRUE(plan.mismatches.empty());
  plan = Plan({"no-rdma", "no-rdma"}, FabricRequirement::kIb);
  EXPECT_FALSE(plan.ok);
  EXPECT_NE(plan.failure.find("no node has a usable RDMA port"), std::string::npos);
  plan = Plan({"no-rdma", "no-rdma"}, FabricRequirement::kAuto);  // nothing to require: sockets
  EXPECT_TRUE(plan.ok);
  EXPECT_EQ(plan.policy, FabricRequirement::kAny);
  EXPECT_FALSE(plan.use_rdma);
  EXPECT_TRUE(plan.warnings.empty()) << "a cluster without RDMA is not warned about";
}

TEST(FabricPlan, ClonedGuidsAndAMissingBootstrapInterfaceAreNamed) {
  std::vector<NodeFabric> nodes = {{0, "a", Fixture("ib8-ndr-a")}, {1, "b", Fixture("ib8-ndr-a", "")}};
  const FabricPlan plan = PlanFabric(nodes, FabricRequirement::kAuto);
  EXPECT_FALSE(plan.ok);
  const std::string table = FormatMismatches(plan.mismatches);
  EXPECT_NE(table.find("bootstrap interface"), std::string::npos) << table;
  EXPECT_NE(table.find("unique (also on node 0)"), std::string::npos) << table;
}

TEST(FabricPlan, RoceNodeWithoutAnIpv4GidIsAMismatch) {
  Inventory broken = Fixture("roce-v2-b");
  for (Device& device : broken.devices) device.ports[0].gids.resize(2);  // only the link-local GIDs
  std::vector<NodeFabric> nodes = {{0, "a", Fixture("roce-v2-a")}, {1, "b", broken}};
  const FabricPlan plan = PlanFabric(nodes, FabricRequirement::kIb);
  EXPECT_FALSE(plan.ok);
  EXPECT_NE(FormatMismatches(plan.mismatches).find("no RoCE v2 IPv4 GID"), std::string::npos);
}

TEST(FabricPlan, JsonRoundTrips) {
  const FabricPlan plan = Plan({"ib8-ndr-a", "ib8-one-down"}, FabricRequirement::kAny);
  EXPECT_EQ(FabricPlan::FromJson(plan.ToJson()).ToJson(), plan.ToJson());
  EXPECT_THROW(FabricPlan::FromJson(nlohmann::json::object()), InventoryError);
}

}  // namespace
}  // namespace bt::rendezvous::fabric
