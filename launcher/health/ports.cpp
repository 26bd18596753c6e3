#include "launcher/health/ports.h"

#include <charconv>
#include <optional>

namespace bt::launcher::health {
namespace {

namespace fabric = rendezvous::fabric;

std::string PortDir(const std::string& sysfs_root, const UsedPort& port) {
  return sysfs_root + "/class/infiniband/" + port.device + "/ports/" + std::to_string(port.port);
}

std::string PortName(const UsedPort& port) { return port.device + " port " + std::to_string(port.port); }

// A counter file's value ("%llu\n"); nullopt when it is missing or not a number.
std::optional<unsigned long long> ReadCounter(const std::string& port_dir, const std::string& name) {
  const std::optional<std::string> text = fabric::ReadSysfsAttribute(port_dir + "/counters/" + name);
  if (!text) return std::nullopt;
  unsigned long long value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value);
  if (error != std::errc() || end != text->data() + text->size()) return std::nullopt;
  return value;
}

PortCounters ReadOnePort(const std::string& sysfs_root, const UsedPort& port) {
  PortCounters read{port, {}};
  const std::string port_dir = PortDir(sysfs_root, port);
  for (const std::string& name : kWatchedPortCounters) {
    if (auto value = ReadCounter(port_dir, name)) read.counters[name] = *value;
  }
  return read;
}

// Fatal when the port is no longer ACTIVE/LinkUp ("DOWN/Polling"; "-" for a port gone from sysfs).
void CheckLinkState(const std::string& sysfs_root, const UsedPort& used, std::vector<Finding>& findings) {
  fabric::Port port;
  fabric::ReadPortState(PortDir(sysfs_root, used), port);
  if (port.Usable()) return;
  const std::string state = (port.state_name.empty() ? "-" : port.state_name) + "/" +
                            (port.phys_state_name.empty() ? "-" : port.phys_state_name);
  findings.push_back({Severity::kFatal, -1, "", used.pci_address, PortName(used) + " not ACTIVE/LinkUp", state,
                      "NCCL uses this port: check the cable, the switch port and the subnet manager; replace the NIC "
                      "or cable if it stays down",
                      0});
}

void CheckCounterGrowth(const PortCounters& baseline, const PortCounters& now, std::vector<Finding>& findings) {
  for (const auto& [name, before] : baseline.counters) {
    auto it = now.counters.find(name);
    if (it == now.counters.end() || it->second <= before) continue;
    findings.push_back({Severity::kWarning, -1, "", baseline.port.pci_address, PortName(baseline.port) + " " + name + " growing",
                        std::to_string(before) + " -> " + std::to_string(it->second),
                        "a flapping or degrading link: check the cable and transceiver; watch for NCCL timeouts", 0});
  }
}

}  // namespace

std::vector<UsedPort> UsedPorts(const fabric::Selection& selection, const fabric::Inventory& inventory) {
  std::vector<UsedPort> ports;
  for (const fabric::SelectedPort& selected : selection.ports) {
    UsedPort used{selected.device, selected.port, ""};
    for (const fabric::Device& device : inventory.devices) {
      if (device.name == selected.device) used.pci_address = device.pci_address;
    }
    ports.push_back(std::move(used));
  }
  return ports;
}

std::vector<PortCounters> ReadPortCounters(const std::string& sysfs_root, const std::vector<UsedPort>& ports) {
  std::vector<PortCounters> counters;
  for (const UsedPort& port : ports) counters.push_back(ReadOnePort(sysfs_root, port));
  return counters;
}

PortCheck CheckPorts(const std::string& sysfs_root, const std::vector<PortCounters>& baseline) {
  PortCheck check;
  for (const PortCounters& before : baseline) {
    CheckLinkState(sysfs_root, before.port, check.findings);
    check.counters.push_back(ReadOnePort(sysfs_root, before.port));
    CheckCounterGrowth(before, check.counters.back(), check.findings);
  }
  return check;
}

}  // namespace bt::launcher::health
