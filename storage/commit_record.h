// Which version of every node's part a committed checkpoint is. A version is uploaded to a
// location of its own (`<job_id>/rank-<r>/.bt-versions/<version>/`, laid out as rank-<r>/ is
// for one checkpoint), so saving a checkpoint again never touches the committed one; it
// becomes current by one small atomic write: its commit record,
// `<job_id>/.bt-commits/<XXH3-128 of the name>.json`, then `latest` (one line: the name).
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "storage/destination.h"

namespace bt::storage {

inline constexpr const char* kCommitFormat = "bt-checkpoint-commit/1";
// A record that carries its save (DESIGN.md §3): written whenever the save is known; format 1
// is still read (it cannot be checked for a mixed or short save).
inline constexpr const char* kCommitFormatWithSave = "bt-checkpoint-commit/2";

struct CommitRecord {
  std::string job_id;
  std::string name;
  std::map<int, std::string> parts;  // node rank → its version; a rank absent holds no part
  // A checkpoint committed before versions existed (`latest` without a record): each part
  // is at rank-<r>/ itself.
  bool unversioned = false;
  // Format 2, the save this is: node 0's save id, the cycle it was written in, how many ranks
  // the job had, the ranks that answered "no part", and the cycle each part was written in.
  // rank_count 0: not known (format 1).
  std::string save;
  int64_t cycle = 0;
  int rank_count = 0;
  std::set<int> no_part;
  std::map<int, int64_t> part_cycles;

  static CommitRecord Unversioned(const std::string& job_id, const std::string& name);
  std::string ToText() const;
  // Throws ManifestError naming `origin` and the field.
  static CommitRecord FromText(const std::string& text, const std::string& origin);
};

// What makes `commit` no one save (each a line): a rank neither with a part nor "no part",
// a part written in another cycle than the save, a rank out of range. Empty for a record of
// format 1, which does not say.
std::vector<std::string> CommitRecordProblems(const CommitRecord& commit);

// "<job_id>/.bt-commits/<XXH3-128 of name>.json": the name as one path segment whatever
// bytes it holds.
std::string CommitRecordPath(const std::string& job_id, const std::string& name);

// "<job_id>/rank-<r>/.bt-versions/<version>": where one version of a node's part is uploaded.
// Hidden, so no checkpoint name can be it (hidden directories are never checkpoints).
std::string VersionRoot(const std::string& job_id, int node_rank, const std::string& version);

// Where node `rank`'s part of `commit` lives (its manifest is <root>/<name>.bt-manifest.json),
// or nullopt when that node holds no part.
std::optional<std::string> PartRoot(const CommitRecord& commit, int rank);

// The committed version of `name`, or nullopt when it was never committed. Throws
// DestinationError, ManifestError.
std::optional<CommitRecord> ReadCommit(Destination& destination, const std::string& job_id, const std::string& name);

// The committed version of the job's `latest` checkpoint, or nullopt when it has none: what
// a load (and a restart's next cycle) starts from. Throws DestinationError, ManifestError.
std::optional<CommitRecord> ReadLatestCommit(Destination& destination, const std::string& job_id);

}  // namespace bt::storage
