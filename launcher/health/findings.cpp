#include "launcher/health/findings.h"

#include <algorithm>
#include <cstdio>

namespace bt::launcher::health {
namespace {

Severity SeverityFromName(const std::string& name, const std::string& where) {
  if (name == "fatal") return Severity::kFatal;
  if (name == "warning") return Severity::kWarning;
  if (name == "skipped") return Severity::kSkipped;
  throw HealthError(where + ".severity: expected fatal, warning or skipped, not \"" + name + "\"");
}

// Field access that names what is wrong: "findings[2].gpu: wrong type".
template <typename T>
T Field(const nlohmann::json& object, const char* name, const std::string& where) {
  auto it = object.find(name);
  if (it == object.end()) throw HealthError(where + "." + name + ": missing");
  try {
    return it->get<T>();
  } catch (const nlohmann::json::exception&) {
    throw HealthError(where + "." + name + ": wrong type");
  }
}

Finding FindingFromJson(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw HealthError(where + ": expected a map");
  Finding finding;
  finding.severity = SeverityFromName(Field<std::string>(json, "severity", where), where);
  finding.gpu = Field<int>(json, "gpu", where);
  finding.uuid = Field<std::string>(json, "uuid", where);
  finding.pci_bus_id = Field<std::string>(json, "pci_bus_id", where);
  finding.what = Field<std::string>(json, "what", where);
  finding.value = Field<std::string>(json, "value", where);
  finding.fix = Field<std::string>(json, "fix", where);
  finding.xid = Field<unsigned long long>(json, "xid", where);
  return finding;
}

// The GPU column: "3 00000000:18:00.0"; for a NIC port its PCI address; "-" for the node.
std::string GpuColumn(const Finding& finding) {
  if (finding.gpu >= 0 && finding.pci_bus_id.empty()) return std::to_string(finding.gpu);
  if (finding.gpu >= 0) return std::to_string(finding.gpu) + " " + finding.pci_bus_id;
  return finding.pci_bus_id.empty() ? "-" : finding.pci_bus_id;
}

std::string OrDash(const std::string& text) { return text.empty() ? "-" : text; }

}  // namespace

std::string SeverityName(Severity severity) {
  switch (severity) {
    case Severity::kFatal: return "fatal";
    case Severity::kWarning: return "warning";
    case Severity::kSkipped: return "skipped";
  }
  return "unknown";
}

nlohmann::json Finding::ToJson() const {
  return {{"severity", SeverityName(severity)}, {"gpu", gpu}, {"uuid", uuid}, {"pci_bus_id", pci_bus_id},
          {"what", what}, {"value", value}, {"fix", fix}, {"xid", xid}};
}

Finding Finding::FromJson(const nlohmann::json& json) { return FindingFromJson(json, "finding"); }

nlohmann::json NodeFindings::ToJson() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const Finding& finding : findings) rows.push_back(finding.ToJson());
  return {{"node", node}, {"host", host}, {"findings", rows}};
}

NodeFindings NodeFindings::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) throw HealthError("health: expected a map");
  NodeFindings node;
  node.node = Field<int>(json, "node", "health");
  node.host = Field<std::string>(json, "host", "health");
  auto rows = json.find("findings");
  if (rows == json.end() || !rows->is_array()) throw HealthError("health.findings: expected a list");
  for (size_t i = 0; i < rows->size(); ++i) {
    node.findings.push_back(FindingFromJson((*rows)[i], "health.findings[" + std::to_string(i) + "]"));
  }
  return node;
}

Finding GpuLostFinding(int gpu, const std::string& uuid, const std::string& pci_bus_id, const std::string& function) {
  return {Severity::kFatal, gpu, uuid, pci_bus_id, "GPU lost (NVML_ERROR_GPU_IS_LOST)", function,
          "the GPU fell off the bus: reboot the node; replace the GPU if it happens again", 0};
}

bool HasFatal(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(),
                     [](const Finding& finding) { return finding.severity == Severity::kFatal; });
}

std::vector<Finding> WithSeverity(const std::vector<Finding>& findings, Severity severity) {
  std::vector<Finding> selected;
  std::copy_if(findings.begin(), findings.end(), std::back_inserter(selected),
               [severity](const Finding& finding) { return finding.severity == severity; });
  return selected;
}

std::string FormatFindingsTable(const std::vector<NodeFindings>& nodes) {
  const bool any = std::any_of(nodes.begin(), nodes.end(), [](const NodeFindings& node) { return !node.findings.empty(); });
  if (!any) return "";
  std::string table;
  char line[1024];
  std::snprintf(line, sizeof line, "%-5s %-20s %-19s %-41s %-44s %-24s %s\n", "node", "host", "gpu", "uuid", "finding",
                "value", "fix");
  table += line;
  for (const NodeFindings& node : nodes) {
    for (const Finding& finding : node.findings) {
      const std::string what = SeverityName(finding.severity) + ": " + finding.what;
      std::snprintf(line, sizeof line, "%-5d %-20s %-19s %-41s %-44s %-24s %s\n", node.node, node.host.c_str(),
                    GpuColumn(finding).c_str(), OrDash(finding.uuid).c_str(), what.c_str(),
                    OrDash(finding.value).c_str(), OrDash(finding.fix).c_str());
      table += line;
    }
  }
  return table;
}

}  // namespace bt::launcher::health
