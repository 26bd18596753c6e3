// The spool:// handoff (docs/CHECKPOINTS.md): the records bt-launch writes for a sidecar
// that uploads, and the sidecar's acknowledgements it reads back. Apart from the
// destination, so that the fuzz target reads and writes them as the backend does.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "storage/commit_record.h"
#include "storage/manifest.h"

namespace bt::storage {

// {"type": "checkpoint", ...}: `local_dir` holds the files, which belong under `rank_dir`
// (the version's own directory). Names are carried as json_bytes.h does.
nlohmann::json SpoolCheckpointRecord(const Manifest& manifest, const std::string& local_dir, const std::string& rank_dir);

// {"type": "latest", ...}: the sidecar writes the commit record, then (`move_latest`) `latest`.
nlohmann::json SpoolCommitRecord(const CommitRecord& commit, bool move_latest);

// The sidecar's acknowledgement, the text of `ack_path`: nullopt for a success (an object
// without "error", such as {}), the error's text for a failure ({"error": ...}). Anything
// else (not JSON, not an object: an ack cut short by a sidecar that does not write it
// atomically) throws DestinationError naming `ack_path`: never taken for a success.
std::optional<std::string> ReadSpoolAck(const std::string& text, const std::string& ack_path);

}  // namespace bt::storage
