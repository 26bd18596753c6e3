#include "rendezvous/fabric/inventory.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/node_info.h"

namespace bt::rendezvous::fabric {
namespace {

namespace fs = std::filesystem;

std::optional<std::string> ReadAttribute(const fs::path& path) { return ReadSysfsAttribute(path.string()); }

std::string Attribute(const fs::path& path) { return ReadAttribute(path).value_or(""); }

// The leading number, as libibumad reads state, rate and LIDs: strtoul(text, 0, 0); 0 (no
// value) when it is above `max`, so that no malformed file overflows the field it fills.
unsigned long LeadingNumber(const std::string& text, unsigned long max) {
  const unsigned long value = std::strtoul(text.c_str(), nullptr, 0);
  return value > max ? 0 : value;
}

constexpr unsigned long kMaxStateCode = 255;   // "%d: %s": the kernel's codes are 0..7
constexpr unsigned long kMaxLid = 0xffff;      // LIDs are 16-bit
constexpr double kMaxRateGbps = 100000;        // 100 Tb/s: far above any link
constexpr int kMaxNumaNode = 4095;

// "4: ACTIVE" -> "ACTIVE".
std::string NameAfterColon(const std::string& text) {
  const size_t colon = text.find(": ");
  return colon == std::string::npos ? text : text.substr(colon + 2);
}

// Entries of `directory` named by an integer in [0, limit), in numeric order; one outside
// it is a warning naming its path, and is left out.
std::vector<int> NumberedEntries(const fs::path& directory, int limit, std::vector<std::string>& warnings) {
  std::vector<int> numbers;
  std::error_code error;
  for (fs::directory_iterator it(directory, error), end; !error && it != end; it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    int number = -1;
    const auto [last, failure] = std::from_chars(name.data(), name.data() + name.size(), number);
    if (failure != std::errc() || number >= limit) {
      warnings.push_back(it->path().string() + ": entry number outside [0, " + std::to_string(limit) +
                         "), ignored (a malformed sysfs tree)");
      continue;
    }
    numbers.push_back(number);
  }
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

int NumaNode(const std::optional<std::string>& text) {
  int node = -1;
  if (!text || std::from_chars(text->data(), text->data() + text->size(), node).ec != std::errc()) return -1;
  return node >= -1 && node <= kMaxNumaNode ? node : -1;
}

// InfiniBand needs GID 0 (subnet prefix) and 1 (an IB router's FLID); RoCE needs the whole
// table to choose as NCCL does. Real tables hold 128 to 255 entries.
std::vector<Gid> ReadGids(const fs::path& port_dir, bool infiniband, int& table_length, std::vector<std::string>& warnings) {
  std::vector<Gid> gids;
  const std::vector<int> indices = NumberedEntries(port_dir / "gids", kMaxGidTableLength, warnings);
  table_length = indices.empty() ? 0 : indices.back() + 1;
  for (int index : indices) {
    if (infiniband && index > 1) break;
    const std::string value = Attribute(port_dir / "gids" / std::to_string(index));
    if (value.empty() || IsZeroGid(value)) continue;
    gids.push_back({index, value, Attribute(port_dir / "gid_attrs" / "types" / std::to_string(index)),
                    Attribute(port_dir / "gid_attrs" / "ndevs" / std::to_string(index))});
  }
  return gids;
}

Port ReadPort(const fs::path& port_dir, int number, std::vector<std::string>& warnings) {
  Port port;
  port.number = number;
  ReadPortState(port_dir.string(), port);
  port.link_layer = ReadAttribute(port_dir / "link_layer").value_or("InfiniBand");  // libibumad's default
  port.rate = Attribute(port_dir / "rate");
  port.rate_gbps = std::strtod(port.rate.c_str(), nullptr);
  if (!std::isfinite(port.rate_gbps) || port.rate_gbps < 0 || port.rate_gbps > kMaxRateGbps) port.rate_gbps = 0;
  port.lid = unsigned(LeadingNumber(Attribute(port_dir / "lid"), kMaxLid));
  port.sm_lid = unsigned(LeadingNumber(Attribute(port_dir / "sm_lid"), kMaxLid));
  port.gids = ReadGids(port_dir, port.IsInfiniBand(), port.gid_table_length, warnings);
  return port;
}

// uverbsN per device name, from <root>/class/infiniband_verbs/uverbsN/ibdev (the numbers
// need not match the device's).
std::vector<std::pair<std::string, std::string>> VerbsDevices(const fs::path& sysfs_root) {
  std::vector<std::pair<std::string, std::string>> names;
  std::error_code error;
  for (fs::directory_iterator it(sysfs_root / "class" / "infiniband_verbs", error), end; !error && it != end;
       it.increment(error)) {
    const std::string entry = it->path().filename().string();
    if (entry.rfind("uverbs", 0) != 0) continue;
    if (auto ibdev = ReadAttribute(it->path() / "ibdev")) names.emplace_back(*ibdev, entry);
  }
  return names;
}

// Whether the verbs character device opens as libibverbs would open it; a warning if not.
bool CheckDeviceNode(const fs::path& node, const std::string& device, std::vector<std::string>& warnings) {
  const int fd = open(node.c_str(), O_RDWR | O_CLOEXEC);
  if (fd >= 0) {
    close(fd);
    return true;
  }
  const char* why = errno == ENOENT ? "is missing (not passed into the container?)" : std::strerror(errno);
  warnings.push_back(device + ": visible in sysfs but " + node.string() + " " + why + ": RDMA cannot use it");
  return false;
}

Device ReadDevice(const fs::path& device_dir, const fs::path& dev_root,
                  const std::vector<std::pair<std::string, std::string>>& verbs, std::vector<std::string>& warnings) {
  Device device;
  device.name = device_dir.filename().string();
  device.node_type = Attribute(device_dir / "node_type");
  device.node_guid = Attribute(device_dir / "node_guid");
  device.sys_image_guid = Attribute(device_dir / "sys_image_guid");
  device.fw_ver = Attribute(device_dir / "fw_ver");
  device.hca_type = Attribute(device_dir / "hca_type");
  device.board_id = Attribute(device_dir / "board_id");
  std::error_code error;
  const fs::path pci = fs::canonical(device_dir / "device", error);
  if (!error) device.pci_address = pci.filename().string();
  device.numa_node = NumaNode(ReadAttribute(device_dir / "device" / "numa_node"));
  for (const auto& [ibdev, uverbs] : verbs) {
    if (ibdev == device.name) device.uverbs = uverbs;
  }
  if (device.uverbs.empty()) {
    warnings.push_back(device.name + ": no verbs device (class/infiniband_verbs) names it: RDMA cannot use it");
  } else {
    device.uverbs_accessible = CheckDeviceNode(dev_root / "infiniband" / device.uverbs, device.name, warnings);
  }
  for (int number : NumberedEntries(device_dir / "ports", kMaxPortNumber + 1, warnings)) {
    device.ports.push_back(ReadPort(device_dir / "ports" / std::to_string(number), number, warnings));
  }
  return device;
}

std::vector<Interface> ReadInterfaces() {
  std::vector<Interface> interfaces;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return interfaces;
  for (ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    auto it = std::find_if(interfaces.begin(), interfaces.end(),
                           [&](const Interface& known) { return known.name == entry->ifa_name; });
    if (it == interfaces.end()) {
      interfaces.push_back({entry->ifa_name, (entry->ifa_flags & IFF_UP) != 0, (entry->ifa_flags & IFF_RUNNING) != 0, {}});
      it = interfaces.end() - 1;
    }
    if (entry->ifa_addr == nullptr) continue;
    const std::string text = AddressText(entry->ifa_addr);
    if (!text.empty()) it->addresses.push_back(text);
  }
  freeifaddrs(list);
  return interfaces;
}

// "/sys" -> "/<name>": device nodes and /etc sit beside the sysfs root.
fs::path BesideSysfs(const std::string& sysfs_root, const std::string& name) {
  fs::path without_slash = fs::path(sysfs_root).lexically_normal();
  if (!without_slash.has_filename()) without_slash = without_slash.parent_path();
  return without_slash.parent_path() / name;
}

bool IsLoopbackAddress(const std::string& text) {
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  return inet_pton(AF_INET6, text.c_str(), &v6) == 1 && IN6_IS_ADDR_LOOPBACK(&v6);
}

std::string MemlockLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_MEMLOCK, &limit) != 0) return "unknown";
  return limit.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_cur);
}

nlohmann::json PortToJson(const Port& port) {
  nlohmann::json gids = nlohmann::json::array();
  for (const Gid& gid : port.gids) {
    gids.push_back({{"index", gid.index}, {"gid", gid.value}, {"type", gid.type}, {"netdev", gid.netdev}});
  }
  nlohmann::json json = {{"port", port.number}, {"state", port.state_name}, {"state_code", port.state},
                         {"phys_state", port.phys_state_name}, {"phys_state_code", port.phys_state},
                         {"link_layer", port.link_layer}, {"rate_gbps", port.rate_gbps}, {"rate", port.rate},
                         {"lid", port.lid}, {"sm_lid", port.sm_lid}, {"gid_table_length", port.gid_table_length},
                         {"gids", gids}};
  if (port.active_mtu) json["active_mtu"] = *port.active_mtu;
  return json;
}

// Field access that names what is wrong: "devices[2].ports[0].rate_gbps: expected a number".
template <typename T>
T Field(const nlohmann::json& object, const char* name, const std::string& where) {
  auto it = object.find(name);
  if (it == object.end()) throw InventoryError(where + "." + name + ": missing");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw InventoryError(where + "." + name + ": wrong type");
  }
}

const nlohmann::json& ArrayField(const nlohmann::json& object, const char* name, const std::string& where) {
  auto it = object.find(name);
  if (it == object.end() || !it->is_array()) throw InventoryError(where + "." + name + ": expected a list");
  return *it;
}

Port PortFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw InventoryError(where + ": expected a map");
  Port port;
  port.number = Field<int>(json, "port", where);
  port.state_name = Field<std::string>(json, "state", where);
  port.state = Field<int>(json, "state_code", where);
  port.phys_state_name = Field<std::string>(json, "phys_state", where);
  port.phys_state = Field<int>(json, "phys_state_code", where);
  port.link_layer = Field<std::string>(json, "link_layer", where);
  port.rate_gbps = Field<double>(json, "rate_gbps", where);
  port.rate = Field<std::string>(json, "rate", where);
  port.lid = Field<unsigned>(json, "lid", where);
  port.sm_lid = Field<unsigned>(json, "sm_lid", where);
  port.gid_table_length = Field<int>(json, "gid_table_length", where);
  if (port.gid_table_length < 0 || port.gid_table_length > kMaxGidTableLength) {
    throw InventoryError(where + ".gid_table_length: expected 0 to " + std::to_string(kMaxGidTableLength));
  }
  const auto& gids = ArrayField(json, "gids", where);
  for (size_t i = 0; i < gids.size(); ++i) {
    const std::string at = where + ".gids[" + std::to_string(i) + "]";
    if (!gids[i].is_object()) throw InventoryError(at + ": expected a map");
    port.gids.push_back({Field<int>(gids[i], "index", at), Field<std::string>(gids[i], "gid", at),
                         Field<std::string>(gids[i], "type", at), Field<std::string>(gids[i], "netdev", at)});
  }
  if (json.contains("active_mtu")) port.active_mtu = Field<int>(json, "active_mtu", where);
  return port;
}

Device DeviceFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw InventoryError(where + ": expected a map");
  Device device;
  device.name = Field<std::string>(json, "name", where);
  device.node_type = Field<std::string>(json, "node_type", where);
  device.node_guid = Field<std::string>(json, "node_guid", where);
  device.sys_image_guid = Field<std::string>(json, "sys_image_guid", where);
  device.fw_ver = Field<std::string>(json, "fw_ver", where);
  device.hca_type = Field<std::string>(json, "hca_type", where);
  device.board_id = Field<std::string>(json, "board_id", where);
  device.pci_address = Field<std::string>(json, "pci_address", where);
  device.numa_node = Field<int>(json, "numa_node", where);
  device.uverbs = Field<std::string>(json, "uverbs", where);
  device.uverbs_accessible = Field<bool>(json, "uverbs_accessible", where);
  const auto& ports = ArrayField(json, "ports", where);
  for (size_t i = 0; i < ports.size(); ++i) {
    device.ports.push_back(PortFromJson(ports[i], where + ".ports[" + std::to_string(i) + "]"));
  }
  return device;
}

}  // namespace

// Plain open/read: a node reads a few hundred of these while the others wait.
std::optional<std::string> ReadSysfsAttribute(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buffer[4096];
  const ssize_t length = read(fd, buffer, sizeof buffer);
  close(fd);
  if (length < 0) return std::nullopt;
  std::string text(buffer, size_t(length));
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

void ReadPortState(const std::string& port_dir, Port& port) {
  const std::string state = Attribute(fs::path(port_dir) / "state");
  port.state = int(LeadingNumber(state, kMaxStateCode));
  port.state_name = NameAfterColon(state);
  const std::string phys = Attribute(fs::path(port_dir) / "phys_state");
  port.phys_state = int(LeadingNumber(phys, kMaxStateCode));
  port.phys_state_name = NameAfterColon(phys);
}

const Gid* Port::FindGid(int index) const {
  for (const Gid& gid : gids) {
    if (gid.index == index) return &gid;
  }
  return nullptr;
}

std::string Port::SubnetPrefix() const {
  const Gid* first = FindGid(0);
  return first == nullptr ? "" : first->value.substr(0, 19);
}

nlohmann::json Inventory::ToJson() const {
  nlohmann::json devices_json = nlohmann::json::array();
  for (const Device& device : devices) {
    nlohmann::json ports = nlohmann::json::array();
    for (const Port& port : device.ports) ports.push_back(PortToJson(port));
    devices_json.push_back({{"name", device.name}, {"node_type", device.node_type}, {"node_guid", device.node_guid},
                            {"sys_image_guid", device.sys_image_guid}, {"fw_ver", device.fw_ver},
                            {"hca_type", device.hca_type}, {"board_id", device.board_id},
                            {"pci_address", device.pci_address}, {"numa_node", device.numa_node},
                            {"uverbs", device.uverbs}, {"uverbs_accessible", device.uverbs_accessible},
                            {"ports", ports}});
  }
  nlohmann::json interfaces_json = nlohmann::json::array();
  for (const Interface& interface : interfaces) {
    interfaces_json.push_back({{"name", interface.name}, {"up", interface.up}, {"running", interface.running},
                               {"addresses", interface.addresses}});
  }
  return {{"infiniband_class", infiniband_class}, {"devices", devices_json}, {"interfaces", interfaces_json},
          {"bootstrap_interface", bootstrap_interface}, {"memlock", memlock}, {"warnings", warnings}};
}

Inventory Inventory::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) throw InventoryError("inventory: expected a map");
  Inventory inventory;
  inventory.infiniband_class = Field<bool>(json, "infiniband_class", "inventory");
  const auto& devices = ArrayField(json, "devices", "inventory");
  for (size_t i = 0; i < devices.size(); ++i) {
    inventory.devices.push_back(DeviceFromJson(devices[i], "devices[" + std::to_string(i) + "]"));
  }
  const auto& interfaces = ArrayField(json, "interfaces", "inventory");
  for (size_t i = 0; i < interfaces.size(); ++i) {
    const std::string at = "interfaces[" + std::to_string(i) + "]";
    if (!interfaces[i].is_object()) throw InventoryError(at + ": expected a map");
    inventory.interfaces.push_back({Field<std::string>(interfaces[i], "name", at), Field<bool>(interfaces[i], "up", at),
                                    Field<bool>(interfaces[i], "running", at),
                                    Field<std::vector<std::string>>(interfaces[i], "addresses", at)});
  }
  inventory.bootstrap_interface = Field<std::string>(json, "bootstrap_interface", "inventory");
  inventory.memlock = Field<std::string>(json, "memlock", "inventory");
  inventory.warnings = Field<std::vector<std::string>>(json, "warnings", "inventory");
  return inventory;
}

std::string SysfsRoot(const std::optional<std::string>& override_root) {
  if (override_root && !override_root->empty()) return *override_root;
  if (const char* root = std::getenv("BT_SYSFS_ROOT"); root != nullptr && *root != '\0') return root;
  return "/sys";
}

Inventory ReadInventory(const std::string& sysfs_root) {
  Inventory inventory;
  inventory.sysfs_root = sysfs_root;
  inventory.interfaces = ReadInterfaces();
  inventory.memlock = MemlockLimit();
  const fs::path root(sysfs_root);
  const fs::path class_dir = root / "class" / "infiniband";
  std::error_code error;
  inventory.infiniband_class = fs::is_directory(class_dir, error);
  if (!inventory.infiniband_class) return inventory;

  const fs::path dev_root = BesideSysfs(sysfs_root, "dev");  // "/sys" -> "/dev"
  const auto verbs = VerbsDevices(root);
  for (fs::directory_iterator it(class_dir, error), end; !error && it != end; it.increment(error)) {
    inventory.devices.push_back(ReadDevice(it->path(), dev_root, verbs, inventory.warnings));
  }
  std::sort(inventory.devices.begin(), inventory.devices.end(), [](const Device& a, const Device& b) {
    return std::tie(a.pci_address, a.name) < std::tie(b.pci_address, b.name);
  });
  if (!inventory.devices.empty() && inventory.memlock != "unlimited") {
    inventory.warnings.push_back("RLIMIT_MEMLOCK is " + inventory.memlock +
                                 " bytes, not unlimited: registering RDMA memory may fail (ulimit -l unlimited, "
                                 "and IPC_LOCK in a container)");
  }
  return inventory;
}

std::string InterfaceWithAddress(const std::vector<Interface>& interfaces, const std::string& local_address) {
  for (const Interface& interface : interfaces) {
    for (const std::string& address : interface.addresses) {
      if (address == local_address) return interface.name;
    }
  }
  return "";
}

bool IsLoopbackInterface(const std::vector<Interface>& interfaces, const std::string& name) {
  for (const Interface& interface : interfaces) {
    if (interface.name != name) continue;
    if (interface.addresses.empty()) return false;
    return std::all_of(interface.addresses.begin(), interface.addresses.end(), IsLoopbackAddress);
  }
  return false;
}

std::string NcclSystemConfigPath(const std::string& sysfs_root) {
  return (BesideSysfs(sysfs_root, "etc") / "nccl.conf").string();
}

std::string FormatInventory(const Inventory& inventory, const GidPreferences& gids) {
  if (!inventory.infiniband_class) return "no RDMA devices (no class/infiniband in sysfs)\n";
  if (inventory.devices.empty()) return "no RDMA devices (class/infiniband is empty)\n";
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line, "%-14s %-4s %-8s %-10s %-6s %-10s %-13s %s\n", "device", "port", "state", "physical",
                "rate", "link layer", "pci", "lid / gid");
  out << line;
  for (const Device& device : inventory.devices) {
    for (const Port& port : device.ports) {
      std::string address;
      if (port.IsInfiniBand()) {
        char lids[64];
        std::snprintf(lids, sizeof lids, "lid 0x%x, sm lid 0x%x", port.lid, port.sm_lid);
        address = lids;
      } else if (const Gid* gid = FindUsableGid(port, gids); gid != nullptr) {
        address = "gid[" + std::to_string(gid->index) + "] " + gid->value + " " + gid->type + " " + gid->netdev;
      } else {
        address = "no " + gids.Describe() + " gid";
      }
      std::snprintf(line, sizeof line, "%-14s %-4d %-8s %-10s %-6g %-10s %-13s %s\n", device.name.c_str(), port.number,
                    port.state_name.c_str(), port.phys_state_name.c_str(), port.rate_gbps, port.link_layer.c_str(),
                    device.pci_address.c_str(), address.c_str());
      out << line;
    }
  }
  for (const std::string& warning : inventory.warnings) out << "warning: " << warning << "\n";
  return out.str();
}

}  // namespace bt::rendezvous::fabric
