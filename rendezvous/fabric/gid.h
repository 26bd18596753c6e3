// RoCE GID choice, as NCCL makes it (src/transport/net_ib/connect.cc ncclIbGetGidIndex;
// docs/FABRIC.md): needed for NCCL_IB_GID_INDEX on NCCL before 2.21 and for the check
// that every RoCE node has a usable RoCE v2 IPv4 GID.
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
};

bool IsZeroGid(const std::string& gid);

// The index NCCL's automatic choice lands on for this port.
int SelectGidIndex(const Port& port, const GidPreferences& preferences);

// The GID NCCL would use on a RoCE port when it is a RoCE v2 IPv4 one, else null.
const Gid* FindRoceV2Ipv4Gid(const Port& port);

}  // namespace bt::rendezvous::fabric
