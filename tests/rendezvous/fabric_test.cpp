// The fabric part of the rendezvous against the fixture trees in tests/fixtures/fabric:
// sysfs parsing, RoCE GID choice, the leader's plan under each policy, and golden NCCL
// environments.
#include <sys/resource.h>
#include <unistd.h>

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

// The environment one node gets from a plan over `nodes` (this node is rank 0).
NcclEnvironment NcclFor(const std::vector<Inventory>& nodes, FabricRequirement require,
                        std::map<std::string, std::string> user = {}, std::optional<NcclVersion> version = std::nullopt) {
  std::vector<NodeFabric> fabric;
  for (size_t i = 0; i < nodes.size(); ++i) fabric.push_back({int(i), "host" + std::to_string(i), nodes[i]});
  const FabricPlan plan = PlanFabric(fabric, require);
  return ComputeNcclEnvironment(
      plan, plan.nodes.front(), nodes.front(),
      [&](const std::string& name) -> std::optional<std::string> {
        auto it = user.find(name);
        return it == user.end() ? std::nullopt : std::optional<std::string>(it->second);
      },
      [&] { return version; });
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

TEST(FabricNcclEnv, LinkWithoutSubnetManagerFallsBackToSocketsUnderAny) {
  const NcclEnvironment environment = NcclFor({Fixture("ib8-no-sm")}, FabricRequirement::kAuto);
  EXPECT_EQ(Exported(environment).at("NCCL_IB_DISABLE"), "1");
  EXPECT_FALSE(Exported(environment).count("NCCL_IB_HCA"));
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
