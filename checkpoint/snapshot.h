// The snapshot taken the moment a checkpoint is declared complete: its files linked (or
// reflinked, or copied) into a private staging directory on the same filesystem, so that
// rotation deleting the checkpoint right after the next save cannot take the upload with it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/layout.h"
#include "storage/destination.h"

namespace bt::checkpoint {

// A file changed or vanished while it was being snapshotted: not complete after all.
class SnapshotChanged : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class StagingMethod { kReflink, kHardlink, kCopy };

struct SnapshotFile {
  std::string path;  // relative to the snapshot's base (and to staging_dir)
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  StagingMethod method = StagingMethod::kCopy;
};

struct Snapshot {
  uint64_t seq = 0;  // the journal's number for this version of the checkpoint
  std::string name;
  std::string layout;
  bool is_directory = true;
  std::string staging_dir;  // absolute; files at staging_dir/<path>
  std::vector<SnapshotFile> files;
  std::map<std::string, std::string> pointers;
  uint64_t total_bytes = 0;
  std::string fingerprint;  // of the source files' identity: a new one means a new version
  // A follower's part taken for node 0's declaration: the save it answers (node 0's version
  // id), so that after a restart it answers that save and no other.
  std::string answers;

  // What a destination uploads: the staged files, this version's number.
  storage::StagedFiles Staged() const;
  // Where this version goes at the destination (storage::VersionRoot): the XXH3-128 of its
  // fingerprint, so an upload resumed after a crash goes where it started, and a checkpoint
  // saved again (new mtimes and inodes) goes somewhere new.
  std::string VersionId() const;
  nlohmann::json ToJson() const;
  // Throws nlohmann::json::exception, or storage::ManifestError for a name or file path
  // that is not a relative path inside the checkpoint.
  static Snapshot FromJson(const nlohmann::json& value);
  // Every file of `candidate` (paths relative to the checkpoint root) is in this snapshot,
  // unchanged: the checkpoint on disk is this version, or this version being deleted.
  bool Holds(const Candidate& candidate) const;
  int64_t NewestMtimeNs() const;
};

// Files up to this size are copied, not linked: frameworks rewrite small files (`latest`,
// trainer_state.json, tracker files) in place, which a hard link would follow.
inline constexpr uint64_t kCopyBelowBytes = 64 * 1024;

// Stages `candidate` (files relative to `root`) into `staging_dir`, which must not exist.
// Throws SnapshotChanged when a file changed meanwhile, std::runtime_error on I/O errors;
// either way nothing is left in `staging_dir`.
Snapshot TakeSnapshot(const std::string& root, const Candidate& candidate, const std::string& staging_dir, uint64_t seq);

// Identity of the candidate's files (path, size, mtime, inode): equal fingerprints mean the
// same version of a checkpoint.
std::string Fingerprint(const Candidate& candidate);

}  // namespace bt::checkpoint
