// RoCE GID choice, as NCCL makes it (src/transport/net_ib/connect.cc ncclIbGetGidIndex;
// docs/FABRIC.md): needed for NCCL_IB_GID_INDEX on NCCL before 2.21 and for the check
// that every RoCE node has a GID NCCL can use under the job's NCCL_IB_ADDR_* settings.
#pragma once

#include <sys/socket.h>

#include <optional>
#include <string>

#include "rendezvous/fabric/inventory.h"

namespace bt::rendezvous::fabric {

// NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM and NCCL_IB_ADDR_RANGE, with NCCL's defaults.
struct GidPreferences {
  int family = AF_INET;
  int roce_version = 2;
  std::string range;  // "10.0.0.0/16", "" = any

  // From the job's environment; throws std::invalid_argument naming the bad variable.
  static GidPreferences FromLookup(const std::optional<std::string>& family, const std::optional<std::string>& version,
                                   const std::optional<std::string>& range);

  // "RoCE v2 IPv4", "RoCE v2 IPv6 in 2001:db8::/32": what a usable GID must be.
  std::string Describe() const;
};

// All-zero in sysfs's colon-separated hex: a GID ("0000:...:0000") or a GUID ("0000:0000:0000:0000").
bool IsZeroGid(const std::string& gid);

// The index NCCL's automatic choice lands on for this port.
int SelectGidIndex(const Port& port, const GidPreferences& preferences);

// The GID NCCL would use on a RoCE port when it is one NCCL can route with: valid (not zero,
// not link-local), of the wanted family, range and RoCE version; else null.
const Gid* FindUsableGid(const Port& port, const GidPreferences& preferences);

}  // namespace bt::rendezvous::fabric
