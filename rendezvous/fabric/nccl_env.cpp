#include "rendezvous/fabric/nccl_env.h"

#include <fcntl.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <sstream>
#include <stdexcept>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/node_info.h"

namespace bt::rendezvous::fabric {
namespace {

const Port* FindPort(const Inventory& inventory, const std::string& device_name, int number) {
  for (const Device& device : inventory.devices) {
    if (device.name != device_name) continue;
    for (const Port& port : device.ports) {
      if (port.number == number) return &port;
    }
  }
  return nullptr;
}

// The user's value as NCCL will read it: one NCCL treats as unset is no choice of the user's.
std::optional<std::string> UserValue(const VariableLookup& user_variable, const std::string& name) {
  std::optional<std::string> value = user_variable(name);
  if (value && NcclTreatsAsUnset(name, *value)) return std::nullopt;
  return value;
}

class Builder {
 public:
  explicit Builder(const VariableLookup& user_variable) : user_variable_(user_variable) {}

  void Offer(const std::string& name, const std::string& value, const std::string& reason) {
    if (auto own = UserValue(user_variable_, name)) {
      result_.kept.push_back({name, *own, "set by the user (bt-launch would set " + value + ": " + reason + ")"});
      return;
    }
    result_.set.push_back({name, value, reason});
  }
  std::optional<std::string> UserSet(const std::string& name) const { return UserValue(user_variable_, name); }
  void Warn(std::string warning) { result_.warnings.push_back(std::move(warning)); }
  NcclEnvironment Take() { return std::move(result_); }

 private:
  const VariableLookup& user_variable_;
  NcclEnvironment result_;
};

// Trailing blanks and a CR go: files written on another system keep them.
std::string TrimRight(std::string text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string HcaList(const Selection& selection) {
  std::string list = "=";
  for (const SelectedPort& port : selection.ports) {
    list += (list.size() > 1 ? "," : "") + port.device + ":" + std::to_string(port.port);
  }
  return list;
}

// NCCL 2.21 and later choose the RoCE GID themselves; older ones take index 0 unless told.
void OfferGidIndex(Builder& builder, const NodePlan& node, const Inventory& inventory, const VariableLookup& user_variable,
                   const VersionLookup& nccl_version) {
  if (builder.UserSet("NCCL_IB_GID_INDEX")) return;
  const std::optional<NcclVersion> version = nccl_version();
  if (!version || !version->Before(2, 21)) return;
  const GidPreferences preferences = GidPreferencesFrom(user_variable);
  std::map<int, std::vector<std::string>> ports_by_index;
  for (const SelectedPort& selected : node.selection.ports) {
    const Port* port = FindPort(inventory, selected.device, selected.port);
    if (port != nullptr) ports_by_index[SelectGidIndex(*port, preferences)].push_back(selected.device + ":" + std::to_string(selected.port));
  }
  if (ports_by_index.size() > 1) {
    // NCCL before 2.21 applies one index to every port: no value is right for all of them,
    // and without one NCCL takes index 0, the link-local GID.
    std::string where;
    for (const auto& [index, ports] : ports_by_index) {
      for (const std::string& port : ports) where += (where.empty() ? "" : ", ") + port + " at " + std::to_string(index);
    }
    builder.Warn("NCCL " + version->Text() + " predates automatic RoCE GID selection (2.21) and takes one NCCL_IB_GID_INDEX "
                 "for every port, but this node's " + preferences.Describe() + " GIDs sit at different indices (" + where +
                 "): NCCL will use index 0, the link-local GID, and RoCE traffic will not route; use NCCL 2.21 or "
                 "later, or give every port its address at the same index");
    return;
  }
  if (ports_by_index.empty()) return;
  builder.Offer("NCCL_IB_GID_INDEX", std::to_string(ports_by_index.begin()->first),
                "NCCL " + version->Text() + " predates automatic RoCE GID selection (2.21); the index NCCL 2.21 "
                "would choose (" + preferences.Describe() + ")");
}

}  // namespace

NcclEnvironment ComputeNcclEnvironment(const FabricPlan& plan, const NodePlan& node, const Inventory& inventory,
                                       const VariableLookup& user_variable, const VersionLookup& nccl_version) {
  Builder builder(user_variable);
  if (!inventory.bootstrap_interface.empty()) {
    const std::string reason = "the interface this node reaches the leader from";
    builder.Offer("NCCL_SOCKET_IFNAME", "=" + inventory.bootstrap_interface, reason);
    builder.Offer("GLOO_SOCKET_IFNAME", inventory.bootstrap_interface, reason);  // Gloo matches the name exactly
  }
  if (!plan.checked()) return builder.Take();
  if (plan.use_rdma && !node.selection.ports.empty()) {
    std::string reason = std::to_string(node.selection.ports.size()) + " ACTIVE " + node.selection.link_layer +
                         " port(s) in PCI order";
    if (plan.node_count > 1 && plan.mismatches.empty()) reason += ", the same shape on all " + std::to_string(plan.node_count) + " nodes";
    if (!node.selection.excluded.empty()) {
      reason += "; left out:";
      for (const std::string& excluded : node.selection.excluded) reason += " " + excluded;
    }
    builder.Offer("NCCL_IB_HCA", HcaList(node.selection), reason);
    if (node.selection.link_layer == "Ethernet") OfferGidIndex(builder, node, inventory, user_variable, nccl_version);
  } else if (!plan.use_rdma) {
    const std::string reason = plan.nodes_without_rdma == plan.node_count
                                   ? "no node has a usable RDMA port: sockets"
                                   : "not every node has usable RDMA and launcher.fabric.require is \"" +
                                         PolicyName(plan.policy) + "\": sockets, the same transport on every node";
    // The user chose HCAs: switching IB off would silently undo that choice. Their choice
    // stands, and the conflict is said.
    if (auto hca = builder.UserSet("NCCL_IB_HCA")) {
      builder.Warn("NCCL_IB_HCA=" + *hca + " is the user's, so NCCL_IB_DISABLE=1 is not set, though the fabric plan "
                   "says sockets (" + reason + "): NCCL will try the chosen HCAs");
    } else {
      builder.Offer("NCCL_IB_DISABLE", "1", reason);
    }
  }
  return builder.Take();
}

bool NcclTreatsAsUnset(const std::string& name, const std::string& value) {
  if (name == "NCCL_SOCKET_IFNAME") return value.size() <= 1;
  return value.empty();
}

GidPreferences GidPreferencesFrom(const VariableLookup& user_variable) {
  return GidPreferences::FromLookup(UserValue(user_variable, "NCCL_IB_ADDR_FAMILY"),
                                    UserValue(user_variable, "NCCL_IB_ROCE_VERSION_NUM"),
                                    UserValue(user_variable, "NCCL_IB_ADDR_RANGE"));
}

namespace {

// NCCL's config files are a few lines; a larger one is read this far.
constexpr size_t kMaxNcclConfigBytes = 1 << 20;

// A regular file only, opened without blocking: a FIFO (or a device) named by
// NCCL_CONF_FILE would otherwise block the launcher's only thread past SIGTERM.
std::string ReadConfigFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return "";
  std::string text;
  struct stat status {};
  if (fstat(fd, &status) == 0 && S_ISREG(status.st_mode)) {
    char buffer[4096];
    for (ssize_t got; text.size() < kMaxNcclConfigBytes && (got = read(fd, buffer, sizeof buffer)) > 0;) {
      text.append(buffer, size_t(got));
    }
  }
  close(fd);
  return text;
}

}  // namespace

std::string NcclUserHome() {
  const passwd* entry = getpwuid(getuid());
  return entry != nullptr && entry->pw_dir != nullptr ? entry->pw_dir : "";
}

NcclConfigFiles NcclConfigFiles::Read(const VariableLookup& job_variable, const std::string& home_dir,
                                      const std::string& system_file) {
  NcclConfigFiles files;
  if (auto path = UserValue(job_variable, "NCCL_CONF_FILE")) {
    files.paths.push_back(*path);
  } else if (!home_dir.empty()) {
    files.paths.push_back(home_dir + "/.nccl.conf");
  }
  files.paths.push_back(system_file);
  for (const std::string& path : files.paths) {
    std::istringstream file(ReadConfigFile(path));
    for (std::string line; std::getline(file, line);) {
      const size_t equals = line.find('=');
      if (line.empty() || line[0] == '#' || equals == std::string::npos || equals == 0) continue;
      const std::string key = line.substr(0, equals);
      if (files.Find(key)) continue;  // the first file wins, as NCCL's setenv(..., 0) does
      files.values.emplace_back(key, TrimRight(line.substr(equals + 1)));
      files.sources.push_back(path);
    }
  }
  return files;
}

std::optional<std::string> NcclConfigFiles::Find(const std::string& name) const {
  for (const auto& [key, value] : values) {
    if (key == name) return value;
  }
  return std::nullopt;
}

std::string NcclConfigFiles::SourceOf(const std::string& name) const {
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].first == name) return sources[i];
  }
  return "";
}

nlohmann::json NcclEnvironmentToJson(const NcclEnvironment& environment) {
  nlohmann::json json = nlohmann::json::object();
  for (const NcclSetting& setting : environment.set) json[setting.name] = setting.value;
  for (const NcclSetting& setting : environment.kept) json[setting.name] = setting.value;
  return json;
}

}  // namespace bt::rendezvous::fabric
