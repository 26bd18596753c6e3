// PyTorch's NCCL flight recorder at a hang: each rank's ring of its last collectives (which
// collective, its sequence number, sizes, scheduled/started/completed). Armed in the job's
// environment unless the job set it. On a hang each rank is asked for a dump through the
// FIFO its ProcessGroupNCCL made (TORCH_NCCL_DEBUG_INFO_PIPE_FILE<rank>.pipe): PyTorch's
// monitor thread writes it (to TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>) within a second or
// two, while the rank's own threads are stuck, long before NCCL's own timeout (10 minutes
// by default) would have dumped it. The dumps are pickles: python3, where there is one, reads
// the last entries of each into the report, with nothing but plain data allowed to load.
#pragma once

#include <chrono>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "env/environment.h"

namespace bt::launcher::watchdog {

struct FlightRecorderFiles {
  std::filesystem::path dump_prefix;  // TORCH_NCCL_DEBUG_INFO_TEMP_FILE: dumps are <prefix><rank>
  std::filesystem::path pipe_prefix;  // TORCH_NCCL_DEBUG_INFO_PIPE_FILE: FIFOs are <prefix><rank>.pipe; empty: none
};

// Offers the recorder's variables under `directory` (the job's own values win) and returns
// the files in force. Throws std::runtime_error naming a folder it cannot create.
FlightRecorderFiles ArmFlightRecorder(const std::filesystem::path& directory, env::JobEnvironment& environment);

struct AskedDump {
  std::filesystem::path path;                              // <dump prefix><rank>
  std::optional<std::filesystem::file_time_type> before;  // its time before it was asked for (an earlier hang's)
};

// Asks every rank whose FIFO is there for a dump (a FIFO nobody reads, left by a rank that
// is gone, is skipped).
std::vector<AskedDump> RequestDumps(const FlightRecorderFiles& files);

// The report's lines on the recorder: waits until every dump `asked` is written anew (or
// `deadline`, or `stop`), then each dump's last entries. Without any FIFO or dump, and no
// GPU, says SKIPPED.
std::string DescribeDumps(const FlightRecorderFiles& files, const std::vector<AskedDump>& asked,
                          std::chrono::steady_clock::time_point deadline, const std::function<bool()>& stop);

// Whether this host has an NVIDIA GPU (its device node, or the driver's list of GPUs).
bool HasGpu();

}  // namespace bt::launcher::watchdog
