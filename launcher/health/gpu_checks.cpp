#include "launcher/health/gpu_checks.h"

#include <cstdio>
#include <utility>

namespace bt::launcher::health {
namespace {

// "a" -> "a, b": appended in place (GCC 12 reports a false -Wrestrict on `"" + string`).
void AppendListed(std::string& list, const std::string& item) {
  if (!list.empty()) list += ", ";
  list += item;
}

// A check and the NVML functions it needs: a missing one SKIPs that check on every GPU.
struct Check {
  const char* name;
  std::vector<std::pair<const char*, bool>> functions;  // name, present
};

std::vector<Check> ChecksOf(const nvml::Functions& f) {
  return {
      {"GPU identity (PCI bus id)", {{"nvmlDeviceGetPciInfo_v3", f.DeviceGetPciInfo_v3 != nullptr}}},
      {"GPU identity (UUID)", {{"nvmlDeviceGetUUID", f.DeviceGetUUID != nullptr}}},
      {"uncorrectable ECC errors", {{"nvmlDeviceGetTotalEccErrors", f.DeviceGetTotalEccErrors != nullptr}}},
      {"row remapping", {{"nvmlDeviceGetRemappedRows", f.DeviceGetRemappedRows != nullptr}}},
      {"clocks slowdown", {{"nvmlDeviceGetCurrentClocksEventReasons", f.DeviceGetCurrentClocksEventReasons != nullptr}}},
      {"PCIe link",
       {{"nvmlDeviceGetCurrPcieLinkGeneration", f.DeviceGetCurrPcieLinkGeneration != nullptr},
        {"nvmlDeviceGetCurrPcieLinkWidth", f.DeviceGetCurrPcieLinkWidth != nullptr},
        {"nvmlDeviceGetMaxPcieLinkGeneration", f.DeviceGetMaxPcieLinkGeneration != nullptr},
        {"nvmlDeviceGetMaxPcieLinkWidth", f.DeviceGetMaxPcieLinkWidth != nullptr}}},
      {"NVLink state", {{"nvmlDeviceGetNvLinkState", f.DeviceGetNvLinkState != nullptr}}},
  };
}

// One node-wide SKIPPED finding per check whose functions the library lacks.
void SkipMissingChecks(const Nvml& nvml, std::vector<Finding>& findings) {
  for (const Check& check : ChecksOf(nvml.functions())) {
    std::string missing;
    for (const auto& [name, present] : check.functions) {
      if (!present) AppendListed(missing, name);
    }
    if (missing.empty()) continue;
    findings.push_back({Severity::kSkipped, -1, "", "", check.name + std::string(" not checked"),
                        missing + " not in " + nvml.library(), "a newer NVIDIA driver has it", 0});
  }
}

// The checks of one GPU, in order, each a few NVML calls. Once a call says the GPU is lost,
// the rest are not made: one fatal finding says it all.
class GpuChecker {
 public:
  GpuChecker(const Nvml& nvml, nvml::Device device, GpuReadings& readings, std::vector<Finding>& findings)
      : f_(nvml.functions()), nvml_(nvml), device_(device), readings_(readings), findings_(findings) {}

  void ReadIdentity() {
    if (f_.DeviceGetUUID != nullptr) {
      char uuid[nvml::kUuidBufferSize] = {};
      if (Read(f_.DeviceGetUUID(device_, uuid, sizeof uuid), "nvmlDeviceGetUUID", "GPU UUID")) readings_.uuid = uuid;
    }
    if (f_.DeviceGetPciInfo_v3 != nullptr && !readings_.lost) {
      nvml::PciInfo pci{};
      if (Read(f_.DeviceGetPciInfo_v3(device_, &pci), "nvmlDeviceGetPciInfo_v3", "GPU PCI bus id")) {
        readings_.pci_bus_id = pci.busId;
      }
    }
  }

  void CheckEcc() {
    if (f_.DeviceGetTotalEccErrors == nullptr || readings_.lost) return;
    unsigned long long count = 0;
    const nvml::Return result =
        f_.DeviceGetTotalEccErrors(device_, nvml::kMemoryErrorTypeUncorrected, nvml::kVolatileEcc, &count);
    if (!Read(result, "nvmlDeviceGetTotalEccErrors", "uncorrectable ECC errors")) return;
    readings_.ecc_uncorrected_volatile = count;
    if (count == 0) return;
    Add(Severity::kFatal, "uncorrectable ECC errors (volatile)", std::to_string(count),
        "drain the node and reset the GPU (nvidia-smi -r); replace the GPU if the errors return");
  }

  void CheckRemappedRows() {
    if (f_.DeviceGetRemappedRows == nullptr || readings_.lost) return;
    unsigned corrected = 0, uncorrected = 0, pending = 0, failure = 0;
    const nvml::Return result = f_.DeviceGetRemappedRows(device_, &corrected, &uncorrected, &pending, &failure);
    if (!Read(result, "nvmlDeviceGetRemappedRows", "row remapping")) return;
    readings_.remap_pending = pending != 0;
    readings_.remap_failure = failure != 0;
    if (pending != 0) {
      Add(Severity::kFatal, "row remapping pending", std::to_string(uncorrected) + " rows remapped for uncorrectable errors",
          "reset the GPU (nvidia-smi -r) or reboot the node to apply the remapping");
    }
    if (failure != 0) {
      Add(Severity::kFatal, "row remapping failed", "failure occurred",
          "a memory bank has no spare rows left: replace the GPU");
    }
  }

  void CheckClocks() {
    if (f_.DeviceGetCurrentClocksEventReasons == nullptr || readings_.lost) return;
    unsigned long long reasons = 0;
    const nvml::Return result = f_.DeviceGetCurrentClocksEventReasons(device_, &reasons);
    if (!Read(result, "nvmlDeviceGetCurrentClocksEventReasons", "clocks slowdown")) return;
    readings_.clocks_event_reasons = reasons;
    const std::string slowdown = DescribeSlowdown(reasons);
    if (slowdown.empty()) return;
    char mask[32];
    std::snprintf(mask, sizeof mask, " (0x%llx)", reasons);
    Add(Severity::kWarning, "clocks slowed by the hardware", slowdown + mask,
        "check cooling, fans and power supply: this GPU is a straggler suspect");
  }

  void CheckPcie() {
    if (!HasPcieFunctions() || readings_.lost) return;
    unsigned generation = 0, width = 0, max_generation = 0, max_width = 0;
    if (!Read(f_.DeviceGetCurrPcieLinkGeneration(device_, &generation), "nvmlDeviceGetCurrPcieLinkGeneration", "PCIe link")) return;
    if (!Read(f_.DeviceGetCurrPcieLinkWidth(device_, &width), "nvmlDeviceGetCurrPcieLinkWidth", "PCIe link")) return;
    if (!Read(f_.DeviceGetMaxPcieLinkGeneration(device_, &max_generation), "nvmlDeviceGetMaxPcieLinkGeneration", "PCIe link")) return;
    if (!Read(f_.DeviceGetMaxPcieLinkWidth(device_, &max_width), "nvmlDeviceGetMaxPcieLinkWidth", "PCIe link")) return;
    readings_.pcie_generation = generation;
    readings_.pcie_width = width;
    readings_.pcie_max_generation = max_generation;
    readings_.pcie_max_width = max_width;
    // An idle GPU trains its link down to save power (an H100 at rest shows Gen1): only a
    // busy GPU's generation says anything about the slot. Width does not change at idle.
    const bool idle = readings_.clocks_event_reasons && (*readings_.clocks_event_reasons & nvml::kClocksEventGpuIdle) != 0;
    const bool slow_generation = !idle && generation < max_generation;
    if (!slow_generation && width >= max_width) return;
    Add(Severity::kWarning, "PCIe link below its maximum",
        "Gen" + std::to_string(generation) + " x" + std::to_string(width) + " (max Gen" + std::to_string(max_generation) +
            " x" + std::to_string(max_width) + ")",
        "reseat the GPU or its riser, check the slot's BIOS settings: host transfers are slower");
  }

  void CheckNvLinks() {
    if (f_.DeviceGetNvLinkState == nullptr || readings_.lost) return;
    std::string down;
    for (unsigned link = 0; link < nvml::kMaxNvLinks; ++link) {
      int active = 0;
      const nvml::Return result = f_.DeviceGetNvLinkState(device_, link, &active);
      // No such link: a PCIe GPU has none, an SXM one fewer than the maximum.
      if (result == nvml::kErrorNotSupported || result == nvml::kErrorInvalidArgument) continue;
      if (!Read(result, "nvmlDeviceGetNvLinkState", "NVLink state")) return;
      ++readings_.nvlinks;
      if (active == nvml::kFeatureEnabled) {
        ++readings_.nvlinks_up;
        continue;
      }
      AppendListed(down, std::to_string(link));
    }
    if (down.empty()) return;
    Add(Severity::kFatal, "NVLink down",
        "link " + down + " inactive (" + std::to_string(readings_.nvlinks_up) + " of " + std::to_string(readings_.nvlinks) +
            " up)",
        "reset the GPU or reboot the node; if it stays down, check the NVSwitch fabric manager and replace the GPU or baseboard");
  }

 private:
  bool HasPcieFunctions() const {
    return f_.DeviceGetCurrPcieLinkGeneration != nullptr && f_.DeviceGetCurrPcieLinkWidth != nullptr &&
           f_.DeviceGetMaxPcieLinkGeneration != nullptr && f_.DeviceGetMaxPcieLinkWidth != nullptr;
  }

  // Whether `result` is a reading. When it is not: a lost GPU is one fatal finding and ends
  // this GPU's checks; anything else (not supported here, no permission) SKIPs `check`.
  bool Read(nvml::Return result, const char* function, const char* check) {
    if (result == nvml::kSuccess) return true;
    if (result == nvml::kErrorGpuIsLost) {
      MarkLost(function);
      return false;
    }
    Add(Severity::kSkipped, std::string(check) + " not checked", std::string(function) + ": " + nvml_.ErrorText(result),
        result == nvml::kErrorNotSupported ? "none: this GPU or driver does not report it" : "see the NVML error");
    return false;
  }

  void MarkLost(const char* function) {
    readings_.lost = true;
    findings_.push_back(GpuLostFinding(readings_.index, readings_.uuid, readings_.pci_bus_id, function));
  }

  void Add(Severity severity, std::string what, std::string value, std::string fix) {
    findings_.push_back(
        {severity, readings_.index, readings_.uuid, readings_.pci_bus_id, std::move(what), std::move(value), std::move(fix), 0});
  }

  const nvml::Functions& f_;
  const Nvml& nvml_;
  nvml::Device device_;
  GpuReadings& readings_;
  std::vector<Finding>& findings_;
};

void CheckGpuCount(unsigned count, std::optional<unsigned> expected, std::vector<Finding>& findings) {
  if (!expected || count >= *expected) return;
  findings.push_back({Severity::kFatal, -1, "", "", "fewer GPUs than expected",
                      std::to_string(count) + " of " + std::to_string(*expected),
                      "a GPU is missing (fallen off the bus, or not passed into the container): check nvidia-smi and "
                      "dmesg on the host; reboot or replace the node",
                      0});
}

// A GPU NVML counts but cannot open: lost, or broken in a way that keeps it from training.
void AddUnopenedGpu(const Nvml& nvml, unsigned index, nvml::Return result, std::vector<Finding>& findings) {
  if (result == nvml::kErrorGpuIsLost) {
    findings.push_back(GpuLostFinding(int(index), "", "", "nvmlDeviceGetHandleByIndex_v2"));
    return;
  }
  findings.push_back({Severity::kFatal, int(index), "", "", "GPU cannot be opened",
                      "nvmlDeviceGetHandleByIndex_v2: " + nvml.ErrorText(result),
                      "check nvidia-smi and dmesg on the host; reset the GPU or reboot the node", 0});
}

GpuReadings SampleGpu(const Nvml& nvml, unsigned index, std::vector<Finding>& findings) {
  GpuReadings readings;
  readings.index = int(index);
  nvml::Device device = nullptr;
  const nvml::Return result = nvml.functions().DeviceGetHandleByIndex_v2(index, &device);
  if (result != nvml::kSuccess) {
    readings.lost = result == nvml::kErrorGpuIsLost;
    AddUnopenedGpu(nvml, index, result, findings);
    return readings;
  }
  GpuChecker checker(nvml, device, readings, findings);
  checker.ReadIdentity();
  checker.CheckEcc();
  checker.CheckRemappedRows();
  checker.CheckClocks();  // before PCIe: an idle GPU's link generation is not judged
  checker.CheckPcie();
  checker.CheckNvLinks();
  return readings;
}

}  // namespace

std::string DescribeSlowdown(unsigned long long reasons) {
  static const std::pair<unsigned long long, const char*> kNames[] = {
      {nvml::kClocksEventHwSlowdown, "HW slowdown"},
      {nvml::kClocksEventSwThermalSlowdown, "SW thermal slowdown"},
      {nvml::kClocksEventHwThermalSlowdown, "HW thermal slowdown"},
      {nvml::kClocksEventHwPowerBrakeSlowdown, "HW power brake"},
  };
  std::string names;
  for (const auto& [bit, name] : kNames) {
    if ((reasons & bit) != 0) AppendListed(names, name);
  }
  return names;
}

NodeSample SampleGpus(const Nvml& nvml, std::optional<unsigned> expected_gpus) {
  NodeSample sample;
  sample.driver_version = nvml.DriverVersion();
  const nvml::Functions& f = nvml.functions();
  if (f.DeviceGetCount_v2 == nullptr || f.DeviceGetHandleByIndex_v2 == nullptr) {
    sample.findings.push_back({Severity::kSkipped, -1, "", "", "GPUs not checked",
                               "nvmlDeviceGetCount_v2 or nvmlDeviceGetHandleByIndex_v2 not in " + nvml.library(),
                               "a newer NVIDIA driver has them", 0});
    return sample;
  }
  unsigned count = 0;
  const nvml::Return result = f.DeviceGetCount_v2(&count);
  if (result != nvml::kSuccess) {
    sample.findings.push_back({Severity::kFatal, -1, "", "", "GPUs cannot be counted",
                               "nvmlDeviceGetCount_v2: " + nvml.ErrorText(result),
                               "check nvidia-smi and dmesg on the host; reboot the node", 0});
    return sample;
  }
  sample.gpu_count = count;
  CheckGpuCount(count, expected_gpus, sample.findings);
  SkipMissingChecks(nvml, sample.findings);
  for (unsigned index = 0; index < count; ++index) sample.gpus.push_back(SampleGpu(nvml, index, sample.findings));
  return sample;
}

}  // namespace bt::launcher::health
