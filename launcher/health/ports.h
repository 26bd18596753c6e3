// The InfiniBand/RoCE ports the fabric plan gave NCCL, read again while the job runs: a port
// no longer ACTIVE/LinkUp is fatal (NCCL on it will fail or hang); an error counter that grew
// since the baseline is a warning (a flapping or degrading link). Read from sysfs with the
// fabric inventory's readers (<sysfs root>/class/infiniband/<dev>/ports/<n>/...).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "launcher/health/findings.h"
#include "rendezvous/fabric/inventory.h"
#include "rendezvous/fabric/plan.h"

namespace bt::launcher::health {

// The counters (ports/<n>/counters/<name>) whose growth is a warning.
inline const std::vector<std::string> kWatchedPortCounters = {"link_downed", "link_error_recovery", "symbol_error"};

struct UsedPort {
  std::string device;       // "mlx5_3"
  int port = 0;
  std::string pci_address;  // the NIC's, "" when unknown
};

// The ports `selection` (this node's part of the fabric plan) uses, with their NIC's PCI
// address from `inventory`.
std::vector<UsedPort> UsedPorts(const rendezvous::fabric::Selection& selection,
                                const rendezvous::fabric::Inventory& inventory);

struct PortCounters {
  UsedPort port;
  std::map<std::string, unsigned long long> counters;  // the watched ones that could be read
};

// The watched counters of every port, now: the baseline a later CheckPorts compares with.
std::vector<PortCounters> ReadPortCounters(const std::string& sysfs_root, const std::vector<UsedPort>& ports);

struct PortCheck {
  std::vector<Finding> findings;
  std::vector<PortCounters> counters;  // read now: the next baseline, to warn once per growth
};

// Every port of `baseline` read again: not ACTIVE/LinkUp is fatal; a watched counter above
// its baseline value is a warning (a counter the baseline lacks is not compared).
PortCheck CheckPorts(const std::string& sysfs_root, const std::vector<PortCounters>& baseline);

}  // namespace bt::launcher::health
