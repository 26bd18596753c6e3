// What the health checks found on a node (issue 30): one Finding per problem, with the GPU
// (or NIC port) it is on, the value read and what to do. Findings travel from every node to
// node 0 as JSON and are printed there as one table, as the fabric's mismatches are.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bt::launcher::health {

// Thrown on published findings that do not have the expected shape.
class HealthError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Severity {
  kFatal,    // the node cannot train: it must leave
  kWarning,  // worth a look (a straggler suspect, a flapping link); training goes on
  kSkipped,  // the check could not run here (no such NVML function, not supported)
};

// "fatal", "warning", "skipped".
std::string SeverityName(Severity severity);

struct Finding {
  Severity severity = Severity::kWarning;
  int gpu = -1;            // NVML index; -1 for the node as a whole or a NIC port
  std::string uuid;        // "GPU-…", "" when unknown or not a GPU
  std::string pci_bus_id;  // the GPU's ("00000000:18:00.0") or the NIC's ("0000:1a:00.0")
  std::string what;        // "uncorrectable ECC errors (volatile)", "mlx5_3 port 1 not ACTIVE/LinkUp"
  std::string value;       // what was read: "2", "DOWN/Polling", "Gen3 x16 (max Gen5 x16)"
  std::string fix;         // what an operator does about it
  unsigned long long xid = 0;  // the Xid of an Xid event's finding, else 0

  nlohmann::json ToJson() const;
  static Finding FromJson(const nlohmann::json& json);  // throws HealthError naming the field
};

// One node's findings, as node 0 collects them.
struct NodeFindings {
  int node = 0;
  std::string host;
  std::vector<Finding> findings;

  nlohmann::json ToJson() const;
  static NodeFindings FromJson(const nlohmann::json& json);  // throws HealthError
};

// A GPU NVML says is lost (NVML_ERROR_GPU_IS_LOST from `function`): fatal.
Finding GpuLostFinding(int gpu, const std::string& uuid, const std::string& pci_bus_id, const std::string& function);

bool HasFatal(const std::vector<Finding>& findings);

// The findings of `severity` only.
std::vector<Finding> WithSeverity(const std::vector<Finding>& findings, Severity severity);

// One table, a row per finding: node, host, GPU (index and PCI bus id), UUID, finding
// (severity: what), value, fix. "" when no node has a finding.
std::string FormatFindingsTable(const std::vector<NodeFindings>& nodes);

}  // namespace bt::launcher::health
