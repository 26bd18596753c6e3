// This node's RDMA fabric as sysfs describes it (docs/FABRIC.md): every InfiniBand/RoCE
// device and port, the IP interfaces, and what breaks RDMA inside a container. Read from
// <sysfs root>/class/infiniband, the root being /sys unless BT_SYSFS_ROOT or --sysfs-root
// names a fixture tree; device nodes are looked up beside it (<root>/../dev/infiniband).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bt::rendezvous::fabric {

// Thrown on a published inventory that does not have the expected shape.
class InventoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Bounds on sysfs numbers: a malformed tree (a stray gids/2147483646) must neither make the
// GID walk spin nor overflow an int. Real GID tables hold 128 to 256 entries; port numbers
// are 8-bit in the verbs API.
inline constexpr int kMaxGidTableLength = 1024;
inline constexpr int kMaxPortNumber = 255;

inline constexpr int kPortInit = 2;    // ports/N/state "2: INIT": link up, no subnet manager yet
inline constexpr int kPortActive = 4;  // ports/N/state "4: ACTIVE"
inline constexpr int kPhysLinkUp = 5;  // ports/N/phys_state "5: LinkUp"

struct Gid {
  int index = 0;
  std::string value;   // "fe80:0000:...": 8 groups of 4 hex digits, as sysfs prints it
  std::string type;    // "IB/RoCE v1", "RoCE v2", or "" when the entry could not be read
  std::string netdev;  // RoCE only
};

struct Port {
  int number = 0;
  int state = 0;            // 4 = ACTIVE
  std::string state_name;   // "ACTIVE"
  int phys_state = 0;       // 5 = LinkUp
  std::string phys_state_name;
  std::string link_layer;   // "InfiniBand", "Ethernet"
  double rate_gbps = 0;
  std::string rate;         // "400 Gb/sec (4X NDR)"
  unsigned lid = 0;
  unsigned sm_lid = 0;
  int gid_table_length = 0;
  std::vector<Gid> gids;    // the non-zero entries only
  std::optional<int> active_mtu;  // bytes, from libibverbs when it could be asked

  bool Usable() const { return state == kPortActive && phys_state == kPhysLinkUp; }
  bool IsInfiniBand() const { return link_layer == "InfiniBand"; }
  const Gid* FindGid(int index) const;
  // The upper 64 bits of GID 0 ("fe80:0000:0000:0000"), "" when there is none.
  std::string SubnetPrefix() const;
};

struct Device {
  std::string name;
  std::string node_type;       // "1: CA"
  std::string node_guid;
  std::string sys_image_guid;
  std::string fw_ver;
  std::string hca_type;
  std::string board_id;
  std::string pci_address;     // "0000:1a:00.0", from the device symlink
  int numa_node = -1;
  std::string uverbs;          // "uverbs0", "" when no verbs device names this one
  bool uverbs_accessible = false;  // /dev/infiniband/uverbsN opens read-write
  std::vector<Port> ports;
};

struct Interface {
  std::string name;
  bool up = false;
  bool running = false;
  std::vector<std::string> addresses;
};

struct Inventory {
  bool infiniband_class = false;  // <root>/class/infiniband exists
  std::vector<Device> devices;    // sorted by PCI address, as NCCL orders them
  std::vector<Interface> interfaces;
  std::string bootstrap_interface;  // the interface that reaches the leader ("" = unknown)
  std::string memlock;              // "unlimited" or a byte count
  std::vector<std::string> warnings;  // what will break RDMA here, one line each
  std::string sysfs_root;  // where it was read from (this node only: never published)

  nlohmann::json ToJson() const;
  static Inventory FromJson(const nlohmann::json& json);  // throws InventoryError naming the field
};

// "/sys" unless `override_root` or BT_SYSFS_ROOT says otherwise.
std::string SysfsRoot(const std::optional<std::string>& override_root);

// Reads everything above. Missing files and failed reads are alike: real sysfs answers
// EINVAL for empty GID slots, so a field simply stays empty.
Inventory ReadInventory(const std::string& sysfs_root);

// One sysfs attribute without its trailing newline; nullopt when it is missing or the read
// fails (EINVAL for an empty GID slot): both mean "no value", as in rdma-core.
std::optional<std::string> ReadSysfsAttribute(const std::string& path);

// A port's state and physical state ("4: ACTIVE", "5: LinkUp") from <port_dir>/state and
// phys_state, as ReadInventory reads them: the health check reads them again while the job
// runs, without the rest of the inventory.
void ReadPortState(const std::string& port_dir, Port& port);

// The interface that holds `local_address` ("" when none does).
std::string InterfaceWithAddress(const std::vector<Interface>& interfaces, const std::string& local_address);

// Whether `name` carries only loopback addresses (127.0.0.0/8, ::1): `lo`, where Debian's
// /etc/hosts sends the host's own name (127.0.1.1).
bool IsLoopbackInterface(const std::vector<Interface>& interfaces, const std::string& name);

// NCCL's system config file as this node sees it: /etc/nccl.conf, or <root>/../etc/nccl.conf
// beside a fixture tree (as device nodes are found beside it).
std::string NcclSystemConfigPath(const std::string& sysfs_root);

struct GidPreferences;

// As ibstat prints it: device, port, state, physical state, rate, link layer, LID or the
// RoCE GID NCCL would use under `gids`.
std::string FormatInventory(const Inventory& inventory, const GidPreferences& gids);

}  // namespace bt::rendezvous::fabric
