#include "launcher/health/xid.h"

#include <algorithm>
#include <utility>

namespace bt::launcher::health {
namespace {

constexpr const char* kRestartApp = "a restart in place can help; if it repeats on this GPU, drain the node and run dcgmi diag";
constexpr const char* kResetGpu = "drain the node and reset the GPU (nvidia-smi -r); replace the GPU if it repeats";
constexpr const char* kRebootNode = "reboot the node; replace the GPU if it happens again";
constexpr const char* kReplaceGpu = "replace the GPU (RMA)";

struct KnownXid {
  unsigned long long xid;
  Severity severity;
  const char* description;
  const char* fix;
};

// The Xids a training job meets, with NVIDIA's Xid catalog action (Ampere and newer) and the
// k8s device plugin's list of application Xids.
constexpr KnownXid kKnownXids[] = {
    {13, Severity::kWarning, "graphics engine exception (an application error)", kRestartApp},
    {31, Severity::kWarning, "GPU memory page fault (an application error)", kRestartApp},
    {43, Severity::kWarning, "GPU stopped processing (an application error)", kRestartApp},
    {45, Severity::kWarning, "preemptive cleanup after an earlier error", kRestartApp},
    {68, Severity::kWarning, "video processor exception", kRestartApp},
    {109, Severity::kWarning, "context switch timeout", kRestartApp},
    {48, Severity::kFatal, "double-bit ECC error", kResetGpu},
    {61, Severity::kFatal, "internal micro-controller breakpoint", kResetGpu},
    {62, Severity::kFatal, "internal micro-controller halt", kResetGpu},
    {63, Severity::kFatal, "row remapping recorded (reset to apply)",
     "drain the node and reset the GPU (nvidia-smi -r) to apply the remapping"},
    {64, Severity::kFatal, "row remapping failed", kReplaceGpu},
    {74, Severity::kFatal, "NVLink error",
     "drain the node and reset the GPU; if it repeats, check the NVSwitch fabric manager and replace the GPU or baseboard"},
    {79, Severity::kFatal, "GPU has fallen off the bus", kRebootNode},
    {92, Severity::kFatal, "high single-bit ECC error rate", kResetGpu},
    {94, Severity::kFatal, "contained uncorrectable ECC error",
     "drain the node and reset the GPU (nvidia-smi -r) to remap the row"},
    {95, Severity::kFatal, "uncontained uncorrectable ECC error",
     "reset the GPU (nvidia-smi -r), reboot the node if the reset fails; replace the GPU if it repeats"},
    {119, Severity::kFatal, "GSP RPC timeout", "reset the GPU (nvidia-smi -r) or reboot the node"},
    {120, Severity::kFatal, "GSP error", "reset the GPU (nvidia-smi -r) or reboot the node"},
    {140, Severity::kFatal, "unrecovered ECC error", kResetGpu},
    {154, Severity::kFatal, "GPU recovery action changed",
     "do the recovery action nvidia-smi -q shows (GPU reset or node reboot)"},
};

const KnownXid* FindXid(unsigned long long xid) {
  const auto* it = std::find_if(std::begin(kKnownXids), std::end(kKnownXids),
                                [xid](const KnownXid& known) { return known.xid == xid; });
  return it == std::end(kKnownXids) ? nullptr : it;
}

Finding NotWatched(const std::string& why, const std::string& fix, int gpu = -1) {
  return {Severity::kSkipped, gpu, "", "", gpu < 0 ? "Xid events not watched" : "Xid events not watched on this GPU", why,
          fix, 0};
}

}  // namespace

bool IsApplicationXid(unsigned long long xid) {
  const KnownXid* known = FindXid(xid);
  return known != nullptr && known->severity == Severity::kWarning;
}

XidClass ClassifyXid(unsigned long long xid) {
  if (const KnownXid* known = FindXid(xid)) return {known->severity, known->description, known->fix};
  // 999 is what NVML reports for an Xid it cannot name.
  return {Severity::kFatal, xid == 999 ? "unknown Xid" : "Xid without an entry here",
          "look it up in NVIDIA's Xid catalog; drain the node and reset the GPU (nvidia-smi -r)"};
}

Finding XidFinding(unsigned long long xid, int gpu, const std::string& uuid, const std::string& pci_bus_id) {
  XidClass xid_class = ClassifyXid(xid);
  return {xid_class.severity, gpu, uuid, pci_bus_id, "Xid " + std::to_string(xid) + ": " + xid_class.description,
          std::to_string(xid), std::move(xid_class.fix), xid};
}

std::unique_ptr<XidReader> XidReader::Open(const Nvml& nvml, std::vector<Finding>& findings) {
  const nvml::Functions& f = nvml.functions();
  if (f.EventSetCreate == nullptr || f.DeviceRegisterEvents == nullptr || f.EventSetWait_v2 == nullptr ||
      f.EventSetFree == nullptr || f.DeviceGetCount_v2 == nullptr || f.DeviceGetHandleByIndex_v2 == nullptr) {
    findings.push_back(
        NotWatched("an NVML event or device function is not in " + nvml.library(), "a newer NVIDIA driver has them"));
    return nullptr;
  }
  unsigned count = 0;
  nvml::Return result = f.DeviceGetCount_v2(&count);
  if (result != nvml::kSuccess) {
    findings.push_back(NotWatched("nvmlDeviceGetCount_v2: " + nvml.ErrorText(result), "see the NVML error"));
    return nullptr;
  }
  nvml::EventSet set = nullptr;
  result = f.EventSetCreate(&set);
  if (result != nvml::kSuccess) {
    findings.push_back(NotWatched("nvmlEventSetCreate: " + nvml.ErrorText(result), "see the NVML error"));
    return nullptr;
  }
  std::vector<Gpu> gpus;
  for (unsigned index = 0; index < count; ++index) {
    nvml::Device device = nullptr;
    result = f.DeviceGetHandleByIndex_v2(index, &device);
    if (result == nvml::kSuccess) result = f.DeviceRegisterEvents(device, nvml::kEventTypeXidCriticalError, set);
    if (result != nvml::kSuccess) {
      // A lost GPU is the sampler's fatal finding; here it only means no events from it.
      findings.push_back(NotWatched(nvml.ErrorText(result), "see the NVML error", int(index)));
      continue;
    }
    // The UUID and PCI id only label the events: without them an event still names the index.
    Gpu gpu{device, int(index), "", ""};
    char uuid[nvml::kUuidBufferSize] = {};
    if (f.DeviceGetUUID != nullptr && f.DeviceGetUUID(device, uuid, sizeof uuid) == nvml::kSuccess) gpu.uuid = uuid;
    nvml::PciInfo pci{};
    if (f.DeviceGetPciInfo_v3 != nullptr && f.DeviceGetPciInfo_v3(device, &pci) == nvml::kSuccess) gpu.pci_bus_id = pci.busId;
    gpus.push_back(std::move(gpu));
  }
  if (gpus.empty()) {
    // The result of freeing an empty set changes nothing: there is nothing to watch either way.
    f.EventSetFree(set);
    return nullptr;
  }
  return std::unique_ptr<XidReader>(new XidReader(nvml, set, std::move(gpus)));
}

XidReader::XidReader(const Nvml& nvml, nvml::EventSet set, std::vector<Gpu> gpus)
    : nvml_(nvml), set_(set), gpus_(std::move(gpus)) {
  for (const Gpu& gpu : gpus_) registered_indices_.push_back(gpu.index);
}

XidReader::~XidReader() {
  // nvmlEventSetFree fails only on a bad set; the reader goes away either way.
  nvml_.functions().EventSetFree(set_);
}

Finding XidReader::FindingOf(const nvml::EventData& event) const {
  for (const Gpu& gpu : gpus_) {
    if (gpu.device == event.device) return XidFinding(event.eventData, gpu.index, gpu.uuid, gpu.pci_bus_id);
  }
  return XidFinding(event.eventData, -1, "", "");
}

std::vector<Finding> XidReader::Wait(unsigned timeout_ms) {
  std::vector<Finding> findings;
  const auto wait = nvml_.functions().EventSetWait_v2;
  unsigned timeout = timeout_ms;
  for (;;) {
    nvml::EventData event{};
    const nvml::Return result = wait(set_, &event, timeout);
    if (result == nvml::kErrorTimeout) return findings;
    if (result == nvml::kErrorGpuIsLost) {
      findings.push_back(GpuLostFinding(-1, "", "", "nvmlEventSetWait_v2"));
      return findings;
    }
    if (result != nvml::kSuccess) {
      findings.push_back({Severity::kSkipped, -1, "", "", "Xid events not read",
                          "nvmlEventSetWait_v2: " + nvml_.ErrorText(result), "see the NVML error", 0});
      return findings;
    }
    if ((event.eventType & nvml::kEventTypeXidCriticalError) != 0) findings.push_back(FindingOf(event));
    timeout = 0;  // take what is queued already, without waiting again
  }
}

}  // namespace bt::launcher::health
