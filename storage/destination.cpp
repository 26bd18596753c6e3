#include "storage/destination.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "storage/commit_record.h"
#include "storage/durable_file.h"
#include "storage/file_copy.h"
#include "storage/hash.h"
#include "storage/json_bytes.h"
#include "storage/paths.h"
#include "storage/spool.h"
#include "storage/subprocess.h"

namespace bt::storage {
namespace {

constexpr const char* kRcloneRemote = "btdest";
constexpr std::chrono::milliseconds kSpoolAckPoll{200};
constexpr size_t kSyncEachFileUpTo = 64;
// Each copy keeps its descriptor until it is synced: a checkpoint of 1,500 files ran into the
// usual soft RLIMIT_NOFILE of 1024 (EMFILE on every retry). Past this many open copies, they
// are synced with one syncfs and closed; every copy is still renamed only at Finish().
constexpr size_t kOpenCopiesAtMost = 64;
constexpr off_t kStartWritebackFrom = 1 << 20;

[[noreturn]] void Fail(const std::string& what) { throw DestinationError(what + ": " + std::strerror(errno)); }

// A manifest, `latest`, a file list or a spool record: durable_file.h's atomic write, its
// failure this destination's error.
void WriteDurably(const std::string& path, const std::string& text) {
  try {
    WriteFileAtomically(path, text);
  } catch (const std::runtime_error& error) {
    throw DestinationError(error.what());
  }
}

// Copies each file under a temporary name, hashing it on the way (file_copy.h); Finish()
// then makes every copy durable and renames them into place.
class AtomicFileBatch {
 public:
  ~AtomicFileBatch() {
    for (const auto& pending : pending_) {
      if (pending.fd >= 0) close(pending.fd);
      unlink(pending.temporary.c_str());
    }
  }

  FileDigest Add(const std::string& from, const std::string& to, const std::function<void(uint64_t)>& on_bytes) {
    const std::string directory = ParentOf(to);
    Pending pending{TemporaryNameBeside(to), to, -1};
    CopiedFile copied;
    try {
      MakeDirectories(directory);
      copied = CopyHashing(from, pending.temporary, on_bytes);
    } catch (const std::runtime_error& error) {
      unlink(pending.temporary.c_str());
      throw DestinationError(error.what());
    }
    pending.fd = copied.fd;
    // What went through the page cache starts its writeback now, so the disk writes it while
    // the next file is copied; small files wait for the one sync at the end.
    if (copied.buffered_bytes >= kStartWritebackFrom) sync_file_range(pending.fd, 0, 0, SYNC_FILE_RANGE_WRITE);
    pending_.push_back(std::move(pending));
    if (++open_copies_ >= kOpenCopiesAtMost) SyncOpenCopies();
    return copied.digest;
  }

  // Many small files: one syncfs of the destination's filesystem costs one journal commit
  // instead of one per file (10,000 fdatasyncs took 30 s under a sanitizer).
  void Finish() {
    if (open_copies_ > kSyncEachFileUpTo) SyncOpenCopies();
    for (auto& pending : pending_) {
      if (pending.fd < 0) continue;
      bool synced = fdatasync(pending.fd) == 0;
      close(pending.fd);
      pending.fd = -1;
      if (!synced) Fail("cannot sync " + pending.temporary);
    }
    for (const auto& pending : pending_) {
      if (rename(pending.temporary.c_str(), pending.target.c_str()) != 0) Fail("cannot rename " + pending.temporary + " to " + pending.target);
    }
    pending_.clear();
    open_copies_ = 0;
  }

 private:
  // One syncfs for every copy still open (they are all on the destination's filesystem),
  // then their descriptors are closed.
  void SyncOpenCopies() {
    auto first_open = std::find_if(pending_.begin(), pending_.end(), [](const Pending& pending) { return pending.fd >= 0; });
    if (first_open == pending_.end()) return;
    const bool synced = syncfs(first_open->fd) == 0;
    const int sync_errno = errno;
    for (auto& pending : pending_) {
      if (pending.fd < 0) continue;
      close(pending.fd);
      pending.fd = -1;
    }
    open_copies_ = 0;
    errno = sync_errno;
    if (!synced) Fail("cannot sync the filesystem of " + first_open->temporary);
  }

  struct Pending {
    std::string temporary;
    std::string target;
    int fd;
  };
  std::vector<Pending> pending_;
  size_t open_copies_ = 0;
};

void AddFile(Manifest& manifest, const std::string& path, const FileDigest& digest) {
  manifest.files.push_back(ManifestFile{path, digest.size, digest.xxh3_128});
  manifest.total_bytes += digest.size;
}

// For backends that hand the staged files to another program: hashed first, while their
// pages are still cached.
void HashStagedFiles(const StagedFiles& staged, Manifest& manifest) {
  for (const std::string& path : staged.paths) {
    AddFile(manifest, path, HashFile(staged.dir + "/" + path));
  }
}

std::optional<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    if (errno == ENOENT || errno == ENOTDIR) return std::nullopt;
    Fail("cannot read " + path);
  }
  std::ostringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

class FileDestination final : public Destination {
 public:
  explicit FileDestination(DestinationSpec spec) : spec_(std::move(spec)) {}
  std::string Describe() const override { return spec_.uri; }

  Manifest Upload(const StagedFiles& staged, Manifest manifest, const std::string& rank_dir,
                  const Progress& progress) override {
    const std::string directory = JoinPath(Root(rank_dir), manifest.base());
    uint64_t done = 0;
    AtomicFileBatch batch;
    for (const std::string& path : staged.paths) {
      FileDigest digest = batch.Add(staged.dir + "/" + path, directory + "/" + path,
                                    [&](uint64_t copied) { progress(done + copied, staged.total_bytes); });
      AddFile(manifest, path, digest);
      done += digest.size;
    }
    batch.Finish();
    // A version's manifest is never replaced: another uploader of the same version that got
    // there first wrote the same files, and its manifest may already be committed.
    const std::string manifest_path = Root(rank_dir) + "/" + ManifestName(manifest.name);
    try {
      WriteFileOnce(manifest_path, manifest.ToJson().dump(2) + "\n");
    } catch (const std::runtime_error& error) {
      throw DestinationError(error.what());
    }
    return manifest;
  }

  void Commit(const CommitRecord& commit, bool move_latest, const std::function<bool()>& may_move_latest) override {
    WriteDurably(Root(CommitRecordPath(commit.job_id, commit.name)), commit.ToText());
    if (!move_latest) return;
    if (!may_move_latest) return WriteDurably(Root(commit.job_id) + "/latest", commit.name + "\n");
    // Asked once more with `latest`'s new text on disk, just before the rename that publishes it.
    try {
      if (may_move_latest()) WriteFileAtomicallyIf(Root(commit.job_id) + "/latest", commit.name + "\n", may_move_latest);
    } catch (const std::runtime_error& error) {
      throw DestinationError(error.what());
    }
  }

  void WriteText(const std::string& path, const std::string& text) override {
    try {
      MakeDirectories(ParentOf(Root(path)));
      WriteDurably(Root(path), text);
    } catch (const std::runtime_error& error) {
      throw DestinationError(error.what());
    }
  }

  std::optional<std::string> ReadText(const std::string& path) override { return ReadWholeFile(Root(path)); }

  void Download(const std::string& remote_dir, const std::vector<std::string>& files, const std::string& local_dir,
                const BytesDone& on_bytes) override {
    uint64_t done = 0;
    bool in_callback = false;  // what on_bytes throws (a stop) is the caller's, passed on as it is
    const auto report = [&](uint64_t copied) {
      in_callback = true;
      on_bytes(done + copied);
      in_callback = false;
    };
    for (const std::string& file : files) {
      const std::string target = local_dir + "/" + file;
      try {
        MakeDirectories(ParentOf(target));
        done += CopyFile(Root(remote_dir) + "/" + file, target, report);
      } catch (const std::runtime_error& error) {
        if (in_callback) throw;
        throw DestinationError(error.what());
      }
    }
  }

  std::vector<std::string> List(const std::string& remote_dir, const std::string& suffix) override {
    std::vector<std::string> found;
    const std::filesystem::path base = Root(remote_dir);
    std::error_code error;
    for (auto it = std::filesystem::recursive_directory_iterator(base, error);
         !error && it != std::filesystem::recursive_directory_iterator(); it.increment(error)) {
      const std::string path = it->path().lexically_relative(base).string();
      if (it->is_regular_file() && path.size() > suffix.size() &&
          path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0) {
        found.push_back(path);
      }
    }
    std::sort(found.begin(), found.end());
    return found;
  }

 private:
  std::string Root(const std::string& relative) const { return JoinPath(spec_.location, relative); }
  DestinationSpec spec_;
};

std::string DescribeRcloneFailure(const ProcessResult& result, const std::string& last_error) {
  if (!result.spawn_error.empty()) return result.spawn_error + " (install rclone: apt-get install rclone)";
  std::string text = "rclone exited " + std::to_string(result.exit_code) + " (" + DescribeRcloneExit(result.exit_code) + ")";
  if (!last_error.empty()) text += ": " + last_error;
  return text;
}

class RcloneDestination final : public Destination {
 public:
  explicit RcloneDestination(DestinationSpec spec) : spec_(std::move(spec)) {}
  std::string Describe() const override { return spec_.uri; }

  Manifest Upload(const StagedFiles& staged, Manifest manifest, const std::string& rank_dir,
                  const Progress& progress) override {
    HashStagedFiles(staged, manifest);
    const std::string list_path = staged.dir + ".files";
    std::string list;
    for (const std::string& path : staged.paths) list += path + "\n";
    WriteDurably(list_path, list);
    std::string last_error;
    ProcessResult result = Rclone(
        {"copy", "--files-from-raw", list_path, "--no-traverse", staged.dir,
         Remote(JoinPath(rank_dir, manifest.base()))},
        [&](const nlohmann::json& line) {
          if (line.contains("stats")) {
            const auto& stats = line["stats"];
            progress(stats.value("bytes", uint64_t(0)), staged.total_bytes);
          }
        },
        last_error);
    unlink(list_path.c_str());
    if (result.exit_code != 0) throw DestinationError(DescribeRcloneFailure(result, last_error));
    progress(staged.total_bytes, staged.total_bytes);
    PutText(JoinPath(rank_dir, ManifestName(manifest.name)), manifest.ToJson().dump(2) + "\n");
    return manifest;
  }

  void Commit(const CommitRecord& commit, bool move_latest, const std::function<bool()>& may_move_latest) override {
    PutText(CommitRecordPath(commit.job_id, commit.name), commit.ToText());
    if (move_latest && (!may_move_latest || may_move_latest())) PutText(commit.job_id + "/latest", commit.name + "\n");
  }

  void WriteText(const std::string& path, const std::string& text) override { PutText(path, text); }

  // `rclone cat` and `copyto` of a missing object both exit 0 (an empty "directory"), so
  // the object is copied to a local file and its absence is the answer.
  std::optional<std::string> ReadText(const std::string& path) override {
    std::string path_template = TemporaryTemplate("bt-launch-get");
    char* temporary = path_template.data();
    int fd = mkstemp(temporary);
    if (fd < 0) Fail("cannot create a temporary file " + path_template);
    close(fd);
    unlink(temporary);
    std::string last_error;
    ProcessResult result = Rclone({"copyto", Remote(path), temporary}, nullptr, last_error);
    std::optional<std::string> text = result.exit_code == 0 ? ReadWholeFile(temporary) : std::nullopt;
    unlink(temporary);
    if (result.exit_code == 0 || IsNotFound(result, last_error)) return text;
    throw DestinationError(DescribeRcloneFailure(result, last_error));
  }

  void Download(const std::string& remote_dir, const std::vector<std::string>& files, const std::string& local_dir,
                const BytesDone& on_bytes) override {
    std::string path_template = TemporaryTemplate("bt-launch-files");
    char* list_path = path_template.data();
    int fd = mkstemp(list_path);
    if (fd < 0) Fail("cannot create a file list " + path_template);
    close(fd);
    std::string list;
    for (const auto& file : files) list += file + "\n";
    WriteDurably(list_path, list);
    std::string last_error;
    uint64_t done = 0;
    ProcessResult result;
    try {
      result = Rclone(
          {"copy", "--files-from-raw", list_path, "--no-traverse", Remote(remote_dir), local_dir},
          [&](const nlohmann::json& line) {
            if (line.contains("stats")) done = line["stats"].value("bytes", done);
          },
          last_error, [&] { on_bytes(done); });
    } catch (...) {
      unlink(list_path);
      throw;
    }
    unlink(list_path);
    if (result.exit_code != 0) throw DestinationError(DescribeRcloneFailure(result, last_error));
  }

  std::vector<std::string> List(const std::string& remote_dir, const std::string& suffix) override {
    std::string last_error;
    ProcessResult result =
        Rclone({"lsf", "-R", "--files-only", "--include", "*" + suffix, Remote(remote_dir)}, nullptr, last_error);
    if (result.exit_code != 0) {
      if (IsNotFound(result, last_error)) return {};
      throw DestinationError(DescribeRcloneFailure(result, last_error));
    }
    std::vector<std::string> found;
    std::istringstream lines(result.output);
    for (std::string line; std::getline(lines, line);) {
      if (!line.empty()) found.push_back(line);
    }
    std::sort(found.begin(), found.end());
    return found;
  }

 private:
  std::string Remote(const std::string& path) const {
    return std::string(kRcloneRemote) + ":" + JoinPath(spec_.location, path);
  }

  static bool IsNotFound(const ProcessResult& result, const std::string& last_error) {
    return result.exit_code == 3 || result.exit_code == 4 || last_error.find("not found") != std::string::npos ||
           last_error.find("doesn't exist") != std::string::npos;
  }

  void PutText(const std::string& path, const std::string& text) {
    std::string path_template = TemporaryTemplate("bt-launch-put");
    char* temporary = path_template.data();
    int fd = mkstemp(temporary);
    if (fd < 0) Fail("cannot create a temporary file " + path_template);
    close(fd);
    WriteDurably(temporary, text);
    std::string last_error;
    ProcessResult result = Rclone({"copyto", temporary, Remote(path)}, nullptr, last_error);
    unlink(temporary);
    if (result.exit_code != 0) throw DestinationError(DescribeRcloneFailure(result, last_error));
  }

  // One rclone run: JSON logs on stderr, the last error kept for the message.
  ProcessResult Rclone(std::vector<std::string> arguments, const std::function<void(const nlohmann::json&)>& on_line,
                       std::string& last_error, const std::function<void()>& every_second = nullptr) {
    std::vector<std::string> argv = {"rclone",         "--use-json-log", "--log-level",       "NOTICE",
                                     "--stats",        "2s",             "--stats-log-level", "NOTICE",
                                     "--retries",      "1",              "--low-level-retries", "3",
                                     "--contimeout",   "10s",            "--timeout",         "60s",
                                     "--s3-disable-checksum", "--s3-upload-concurrency", "8", "--s3-chunk-size", "16M"};
    argv.insert(argv.begin() + 1, arguments.begin(), arguments.end());
    return RunProcess(argv, spec_.rclone_environ, [&](const std::string& text) {
      nlohmann::json line = nlohmann::json::parse(text, nullptr, false);
      if (line.is_discarded()) {
        if (!text.empty()) last_error = text;
        return;
      }
      // rclone's own lines; one of another shape (a field of another type) is not ours to read.
      try {
        if (line.value("level", "") == "error") last_error = line.value("msg", text);
        if (on_line) on_line(line);
      } catch (const nlohmann::json::exception&) {
      }
    }, every_second);
  }

  DestinationSpec spec_;
};

// One record per checkpoint for a sidecar (docs/CHECKPOINTS.md): written atomically as
// <dir>/<record>.json, acknowledged by the sidecar writing <dir>/<record>.json.ack.
class SpoolDestination final : public Destination {
 public:
  explicit SpoolDestination(DestinationSpec spec) : spec_(std::move(spec)) {}
  std::string Describe() const override { return spec_.uri; }

  Manifest Upload(const StagedFiles& staged, Manifest manifest, const std::string& rank_dir,
                  const Progress& progress) override {
    HashStagedFiles(staged, manifest);
    const nlohmann::json record = SpoolCheckpointRecord(manifest, staged.dir, rank_dir);
    const std::string stem = manifest.job_id + "--rank-" + std::to_string(manifest.node_rank) + "--" +
                             std::to_string(staged.version);
    HandOff(stem, record);
    progress(staged.total_bytes, staged.total_bytes);
    return manifest;
  }

  // The sidecar writes `commit_path` (its content given whole), then, when `move_latest`,
  // `remote_path`, each as one atomic write.
  void Commit(const CommitRecord& commit, bool move_latest, const std::function<bool()>& may_move_latest) override {
    const bool moves = move_latest && (!may_move_latest || may_move_latest());
    HandOff(commit.job_id + "--latest--" + std::to_string(++latest_count_), SpoolCommitRecord(commit, moves));
  }

  // A sidecar's records carry checkpoints and commits only.
  void WriteText(const std::string& path, const std::string&) override {
    throw DestinationError(spec_.uri + " is a spool: its sidecar carries checkpoints only, not " + path);
  }
  std::optional<std::string> ReadText(const std::string&) override { throw WriteOnly(); }
  void Download(const std::string&, const std::vector<std::string>&, const std::string&, const BytesDone&) override {
    throw WriteOnly();
  }
  std::vector<std::string> List(const std::string&, const std::string&) override { throw WriteOnly(); }

 private:
  DestinationError WriteOnly() const {
    return DestinationError(spec_.uri + " is a spool: bt-launch hands checkpoints to a sidecar there and cannot read "
                                        "them back; load from where the sidecar uploads them");
  }

  // Blocks until the sidecar acknowledges; an ack carrying {"error": ...} is a failed upload.
  void HandOff(const std::string& stem, const nlohmann::json& record) {
    const std::string path = spec_.location + "/" + stem + ".json";
    const std::string ack = path + ".ack";
    unlink(ack.c_str());
    WriteDurably(path, record.dump(2) + "\n");
    while (true) {
      if (auto answer = ReadWholeFile(ack)) {
        // Removed when it is no success: the record is written again after the backoff,
        // and only the answer to that one counts.
        std::optional<std::string> error;
        try {
          error = ReadSpoolAck(*answer, ack);
        } catch (const DestinationError&) {
          unlink(ack.c_str());
          throw;
        }
        if (error) {
          unlink(ack.c_str());
          throw DestinationError("the spool's uploader failed " + stem + ": " + *error);
        }
        return;
      }
      std::this_thread::sleep_for(kSpoolAckPoll);
    }
  }

  DestinationSpec spec_;
  int latest_count_ = 0;
};

void Put(std::vector<std::string>& environ, const std::string& key, const std::string& value) {
  environ.push_back(std::string("RCLONE_CONFIG_BTDEST_") + key + "=" + value);
}

std::string Lookup(const std::map<std::string, std::string>& variables, const std::string& name) {
  auto it = variables.find(name);
  return it == variables.end() ? "" : it->second;
}

}  // namespace

std::string MaskCredentials(const std::string& uri) {
  const size_t separator = uri.find("://");
  if (separator == std::string::npos) {
    // Not a URI: a user:secret@ part can still be in it.
    const size_t at = uri.find('@');
    return at == std::string::npos ? uri : "***" + uri.substr(at);
  }
  // The credentials end at the last '@' whose text before it is a user (no '/') or a
  // user:secret pair: secrets may hold '/' and '@' (AWS secret keys do), bucket names never.
  const size_t authority = separator + 3;
  for (size_t at = uri.rfind('@'); at != std::string::npos && at >= authority; at = at == 0 ? std::string::npos : uri.rfind('@', at - 1)) {
    const std::string user_info = uri.substr(authority, at - authority);
    if (user_info.find('/') == std::string::npos || user_info.find(':') != std::string::npos) {
      return uri.substr(0, authority) + "***" + uri.substr(at);
    }
  }
  return uri;
}

DestinationSpec ParseDestination(const std::string& uri, const std::string& origin) {
  const std::string shown = MaskCredentials(uri);
  const auto separator = uri.find("://");
  if (separator == std::string::npos) {
    throw DestinationError(origin + ": expected a URI such as file:///path, s3://bucket/prefix or spool:///path, got \"" + shown + "\"");
  }
  DestinationSpec spec;
  spec.uri = uri;
  spec.scheme = uri.substr(0, separator);
  spec.location = uri.substr(separator + 3);
  while (spec.location.size() > 1 && spec.location.back() == '/') spec.location.pop_back();
  const bool local = spec.scheme == "file" || spec.scheme == "spool";
  const bool remote = spec.scheme == "s3" || spec.scheme == "gs" || spec.scheme == "r2" || spec.scheme == "azure";
  if (!local && !remote) {
    throw DestinationError(origin + ": unsupported scheme \"" + spec.scheme + "\" (expected file, s3, gs, r2, azure or spool)");
  }
  if (local && (spec.location.empty() || spec.location.front() != '/')) {
    throw DestinationError(origin + ": expected " + spec.scheme + ":///absolute/path, got \"" + shown + "\"");
  }
  if (remote && (spec.location.empty() || spec.location.front() == '/')) {
    throw DestinationError(origin + ": expected " + spec.scheme + "://bucket[/prefix], got \"" + shown + "\"");
  }
  // rclone takes no credentials from a path: "KEY:SECRET@bucket" would be the bucket's name,
  // and would reach rclone's own messages unmasked.
  if (shown != uri) {
    throw DestinationError(origin + ": credentials in the URI (\"" + shown + "\") are not used: give them in the "
                           "secret named by launcher.checkpoint.auth_secret_name, or the provider's variables "
                           "(AWS_ACCESS_KEY_ID, ...)");
  }
  return spec;
}

std::optional<std::string> UncarriableName(const DestinationSpec& spec, const std::string& name,
                                           const std::vector<std::string>& paths) {
  const auto has_line_break = [](const std::string& text) { return text.find_first_of("\n\r") != std::string::npos; };
  if (has_line_break(name)) return "its name has a newline or CR, and `latest` names a checkpoint in one line";
  if (spec.scheme == "file" || spec.scheme == "spool") return std::nullopt;
  for (const std::string& path : paths) {
    if (has_line_break(path)) {
      return "file \"" + path + "\" has a newline or CR in its name, which rclone's file list (" + spec.scheme +
             "://) cannot carry";
    }
  }
  return std::nullopt;
}

std::unique_ptr<Destination> OpenDestination(const DestinationSpec& spec) {
  if (spec.scheme == "file") return std::make_unique<FileDestination>(spec);
  if (spec.scheme == "spool") return std::make_unique<SpoolDestination>(spec);
  return std::make_unique<RcloneDestination>(spec);
}

std::vector<std::string> RcloneEnvironment(const std::string& scheme, const std::optional<std::string>& secret_json,
                                           const std::string& secret_name,
                                           const std::map<std::string, std::string>& inherited) {
  std::vector<std::string> environ;
  for (const char* name : {"PATH", "HOME", "TMPDIR", "TZ"}) {
    std::string value = Lookup(inherited, name);
    if (!value.empty()) environ.push_back(std::string(name) + "=" + value);
  }
  if (Lookup(inherited, "PATH").empty()) environ.push_back("PATH=/usr/local/bin:/usr/bin:/bin");
  nlohmann::json secret = nlohmann::json::object();
  if (secret_json) {
    secret = nlohmann::json::parse(*secret_json, nullptr, false);
    if (!secret.is_object()) {
      throw DestinationError("secret \"" + secret_name + "\": expected a JSON object of credentials (its value is not shown)");
    }
  }
  auto secret_field = [&](const char* key) -> std::string {
    if (!secret.contains(key)) return "";
    if (!secret[key].is_string()) {
      throw DestinationError("secret \"" + secret_name + "\": field " + key + " must be a string (its value is not shown)");
    }
    return secret[key].get<std::string>();
  };
  if (scheme == "s3" || scheme == "r2") {
    Put(environ, "TYPE", "s3");
    std::string key_id = secret_json ? secret_field("aws_access_key_id") : Lookup(inherited, "AWS_ACCESS_KEY_ID");
    std::string key = secret_json ? secret_field("aws_secret_access_key") : Lookup(inherited, "AWS_SECRET_ACCESS_KEY");
    std::string region = secret_json ? secret_field("aws_region") : Lookup(inherited, "AWS_REGION");
    if (region.empty()) region = Lookup(inherited, "AWS_DEFAULT_REGION");
    std::string token = secret_json ? secret_field("aws_session_token") : Lookup(inherited, "AWS_SESSION_TOKEN");
    if (secret_json && (key_id.empty() || key.empty())) {
      throw DestinationError("secret \"" + secret_name + "\": expected aws_access_key_id and aws_secret_access_key");
    }
    std::string endpoint = Lookup(inherited, "AWS_ENDPOINT_URL_S3");
    if (endpoint.empty()) endpoint = Lookup(inherited, "AWS_ENDPOINT_URL");
    if (secret_json && !secret_field("endpoint_url").empty()) endpoint = secret_field("endpoint_url");
    Put(environ, "PROVIDER", scheme == "r2" ? "Cloudflare" : endpoint.empty() ? "AWS" : "Other");
    if (!key_id.empty()) {
      Put(environ, "ACCESS_KEY_ID", key_id);
      Put(environ, "SECRET_ACCESS_KEY", key);
      if (!token.empty()) Put(environ, "SESSION_TOKEN", token);
    } else {  // instance profile or web identity (IRSA): let rclone's SDK find them
      Put(environ, "ENV_AUTH", "true");
      for (const char* name : {"AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
                               "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                               "AWS_CONTAINER_AUTHORIZATION_TOKEN"}) {
        std::string value = Lookup(inherited, name);
        if (!value.empty()) environ.push_back(std::string(name) + "=" + value);
      }
    }
    if (!region.empty()) Put(environ, "REGION", region);
    if (!endpoint.empty()) Put(environ, "ENDPOINT", endpoint);
    Put(environ, "NO_CHECK_BUCKET", "true");
  } else if (scheme == "gs") {
    Put(environ, "TYPE", "google cloud storage");
    Put(environ, "BUCKET_POLICY_ONLY", "true");
    if (secret_json) {
      Put(environ, "SERVICE_ACCOUNT_CREDENTIALS", secret.dump());
    } else if (!Lookup(inherited, "GOOGLE_APPLICATION_CREDENTIALS").empty()) {
      Put(environ, "SERVICE_ACCOUNT_FILE", Lookup(inherited, "GOOGLE_APPLICATION_CREDENTIALS"));
    } else {
      Put(environ, "ENV_AUTH", "true");
    }
  } else if (scheme == "azure") {
    Put(environ, "TYPE", "azureblob");
    std::string account = secret_json ? secret_field("account_name") : Lookup(inherited, "AZURE_STORAGE_ACCOUNT");
    std::string key = secret_json ? secret_field("account_key") : Lookup(inherited, "AZURE_STORAGE_KEY");
    if (!account.empty()) Put(environ, "ACCOUNT", account);
    if (!key.empty()) {
      Put(environ, "KEY", key);
    } else {
      Put(environ, "ENV_AUTH", "true");
    }
  }
  return environ;
}

std::string DescribeRcloneExit(int exit_code) {
  switch (exit_code) {
    case 0: return "success";
    case 1: return "uncategorised error";
    case 2: return "syntax or usage error";
    case 3: return "directory not found";
    case 4: return "file not found";
    case 5: return "temporary error";
    case 6: return "less serious error, such as a source file changing during the copy";
    case 7: return "fatal error, such as bad credentials or a suspended account";
    case 8: return "transfer limit reached";
    case 9: return "nothing transferred";
    case 10: return "duration limit reached";
    case 127: return "rclone could not be run";
  }
  return exit_code > 128 ? "killed by a signal" : "unknown exit code";
}

}  // namespace bt::storage
