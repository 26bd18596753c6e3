// Where committed checkpoints go, one interface with three backends:
//   file://DIR   written by bt-launch itself (hashing copy under a temporary name, fsync, rename);
//   s3:// gs:// r2:// azure://   through rclone, with credentials in its environment only;
//   spool://DIR  a handoff record per checkpoint for an external uploader, which acks it.
// Layout under the destination: each upload into the directory it is given (a version's own,
// <job_id>/rank-<r>/.bt-versions/<version>/: <checkpoint>/<files> and the manifest beside
// the checkpoint), a commit record per checkpoint and <job_id>/latest (storage/commit_record.h).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "storage/manifest.h"

namespace bt::storage {

struct CommitRecord;

class DestinationError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DestinationSpec {
  std::string uri;     // as configured; ParseDestination refuses one with credentials, so it can be shown
  std::string scheme;  // file, s3, gs, r2, azure, spool
  std::string location;  // after "scheme://": a directory, or bucket[/prefix]
  std::vector<std::string> rclone_environ;  // the whole environment rclone runs with
};

// The files of one upload, already staged where nothing else writes: `dir`/<path> each.
struct StagedFiles {
  std::string dir;
  std::vector<std::string> paths;
  uint64_t total_bytes = 0;
  uint64_t version = 0;  // names the spool's record: a checkpoint saved again gets a new one
};

// `uri` with the credentials written into it masked: "s3://KEY:SECRET@bucket/p" ->
// "s3://***@bucket/p". Unchanged when there are none.
std::string MaskCredentials(const std::string& uri);

// Parses a destination URI. Throws DestinationError naming `origin` (the config field or
// variable it came from).
DestinationSpec ParseDestination(const std::string& uri, const std::string& origin);

// Called with bytes done and bytes in all.
using Progress = std::function<void(uint64_t done, uint64_t total)>;
using BytesDone = std::function<void(uint64_t done)>;

class Destination {
 public:
  virtual ~Destination() = default;
  virtual std::string Describe() const = 0;

  // Data files first (read from staged.dir), then the manifest. `manifest` comes
  // with its header (job, rank, name, layout, pointers) and no files: each backend adds every
  // file's size and XXH3-128 (file:// as it copies them) and returns what it uploaded.
  // `rank_dir` is "<job_id>/rank-<r>". Throws DestinationError.
  virtual Manifest Upload(const StagedFiles& staged, Manifest manifest, const std::string& rank_dir,
                          const Progress& progress) = 0;
  // Makes the versions `commit` names current, after every node's part of them is uploaded:
  // its commit record, then (with `move_latest`) <job_id>/latest := its name. Each is one
  // atomic write; what a version's upload wrote is never written again. `may_move_latest`,
  // asked between the two writes, keeps `latest` as it is when it says no (a commit fence).
  virtual void Commit(const CommitRecord& commit, bool move_latest,
                      const std::function<bool()>& may_move_latest = nullptr) = 0;

  // A small file that is no checkpoint (the job's report, <job_id>/.bt-report/), written
  // whole at `path`, replacing what was there. Throws DestinationError.
  virtual void WriteText(const std::string& path, const std::string& text) = 0;

  // Reading back (loading a checkpoint, `bt-launch checkpoints`). nullopt when absent.
  virtual std::optional<std::string> ReadText(const std::string& path) = 0;
  // `on_bytes` sees the bytes downloaded so far at least once a second, and may throw to
  // stop the download (what was written to `local_dir` is then the caller's to remove).
  virtual void Download(const std::string& remote_dir, const std::vector<std::string>& files,
                        const std::string& local_dir, const BytesDone& on_bytes) = 0;
  // Paths under `remote_dir` (relative to it) that end with `suffix`, recursively.
  virtual std::vector<std::string> List(const std::string& remote_dir, const std::string& suffix) = 0;
};

std::unique_ptr<Destination> OpenDestination(const DestinationSpec& spec);

// Why `spec` cannot carry a checkpoint named `name` with these files (paths relative to its
// base), or nullopt when it can. `latest` is one line, so no destination carries a name with
// a newline or CR; rclone reads its file list one name a line (--files-from-raw), so no
// rclone destination carries a file whose path has one. Such a checkpoint is refused whole:
// uploaded without the file it would be committed as complete.
std::optional<std::string> UncarriableName(const DestinationSpec& spec, const std::string& name,
                                           const std::vector<std::string>& paths);

// The environment rclone runs with for `scheme`: PATH and HOME, and the credentials as an
// on-the-fly remote named "btdest" (RCLONE_CONFIG_BTDEST_*). `secret_json` is the content
// of the auth secret, if one is configured; else the standard variables of `inherited`
// (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL[_S3], ...).
// Throws DestinationError naming `secret_name`, never the value.
std::vector<std::string> RcloneEnvironment(const std::string& scheme, const std::optional<std::string>& secret_json,
                                           const std::string& secret_name,
                                           const std::map<std::string, std::string>& inherited);

// rclone's documented exit codes, in words.
std::string DescribeRcloneExit(int exit_code);

}  // namespace bt::storage
