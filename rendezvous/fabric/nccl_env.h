// The NCCL and Gloo variables one node's job gets from the fabric plan
// (../shared/reference/ib-nccl.md §2.6; docs/FABRIC.md): only where the user has not set
// them, each with the reason it is set.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rendezvous/fabric/gid.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/fabric/nccl_library.h"
#include "rendezvous/fabric/plan.h"

namespace bt::rendezvous::fabric {

struct NcclSetting {
  std::string name;
  std::string value;
  std::string reason;
};

struct NcclEnvironment {
  std::vector<NcclSetting> set;   // to export
  std::vector<NcclSetting> kept;  // the user's own values, left alone (reason says what we would have set)
  std::vector<std::string> warnings;  // conflicts and settings NCCL needs that no variable can express
};

// The user's value of an NCCL variable: the job's environment, else NCCL's config files.
using VariableLookup = std::function<std::optional<std::string>(const std::string& name)>;

// A value NCCL reads as unset: empty (NCCL tests the first character), and for
// NCCL_SOCKET_IFNAME anything of one character (ncclFindInterfaces ignores it).
bool NcclTreatsAsUnset(const std::string& name, const std::string& value);

// NCCL's config files, as its initEnv reads them: NCCL_CONF_FILE, else ~/.nccl.conf; then
// the system file. `KEY=VALUE` lines, `#` comments; a key the first file sets wins, and the
// environment beats both (NCCL calls setenv without overwrite).
// The home directory NCCL reads .nccl.conf from: getpwuid(getuid())'s, as NCCL's own
// lookup does ("" when there is no passwd entry). The job runs as the launcher's user.
std::string NcclUserHome();

struct NcclConfigFiles {
  std::vector<std::string> paths;                      // in precedence order, existing or not
  std::vector<std::pair<std::string, std::string>> values;  // key, value (first file wins)
  std::vector<std::string> sources;                    // the file each value came from

  // `job_variable` is the job's environment (NCCL_CONF_FILE); `home_dir` is where NCCL looks
  // for .nccl.conf: the passwd entry's home of the job's user (NcclUserHome), not $HOME;
  // `system_file` is /etc/nccl.conf (beside the sysfs root in fixture trees).
  static NcclConfigFiles Read(const VariableLookup& job_variable, const std::string& home_dir,
                              const std::string& system_file);
  std::optional<std::string> Find(const std::string& name) const;
  std::string SourceOf(const std::string& name) const;  // "" when no file sets it
};

// The job's NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM, NCCL_IB_ADDR_RANGE (values NCCL
// reads as unset count as unset). Throws std::invalid_argument naming a malformed one.
GidPreferences GidPreferencesFrom(const VariableLookup& user_variable);
using VersionLookup = std::function<std::optional<NcclVersion>()>;

// `node` is this node's part of `plan`; `inventory` is this node's own (its GID tables and
// bootstrap interface). The NCCL version is asked only when RoCE needs it.
// Throws std::invalid_argument on a malformed NCCL_IB_ADDR_* variable of the user's.
NcclEnvironment ComputeNcclEnvironment(const FabricPlan& plan, const NodePlan& node, const Inventory& inventory,
                                       const VariableLookup& user_variable, const VersionLookup& nccl_version);

nlohmann::json NcclEnvironmentToJson(const NcclEnvironment& environment);

}  // namespace bt::rendezvous::fabric
