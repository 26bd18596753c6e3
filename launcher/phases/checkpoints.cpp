#include "launcher/phases/checkpoints.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <thread>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/phases/commit_board.h"
#include "storage/commit_record.h"
#include "storage/durable_file.h"
#include "storage/hash.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"
#include "storage/paths.h"
#include "storage/subprocess.h"

namespace bt::launcher {
namespace {

using storage::DestinationError;
using storage::Manifest;
using storage::ManifestError;

constexpr const char* kDefaultDestinationDir = "/var/lib/bt-launch/checkpoints";
constexpr std::chrono::seconds kLoadLogEvery{10};

// Files of `manifest` under `local_dir` that differ from it: size, or XXH3-128.
std::vector<std::string> CompareWithManifest(const Manifest& manifest, const std::string& local_dir) {
  std::vector<std::string> problems;
  for (const auto& file : manifest.files) {
    const std::string path = local_dir + "/" + file.path;
    try {
      storage::FileDigest digest = storage::HashFile(path);
      if (digest.size != file.size) {
        problems.push_back(file.path + ": " + std::to_string(digest.size) + " bytes, the manifest says " +
                           std::to_string(file.size));
      } else if (digest.xxh3_128 != file.xxh3_128) {
        problems.push_back(file.path + ": XXH3-128 " + digest.xxh3_128 + ", the manifest says " + file.xxh3_128);
      }
    } catch (const std::runtime_error& error) {
      problems.push_back(error.what());
    }
  }
  return problems;
}

std::vector<std::string> FilePaths(const Manifest& manifest) {
  std::vector<std::string> paths;
  for (const auto& file : manifest.files) paths.push_back(file.path);
  return paths;
}

std::string IsoTime(int64_t unix_seconds) {
  time_t time = time_t(unix_seconds);
  tm utc{};
  gmtime_r(&time, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}


// The committed version `reference` names: the job's latest, or the named checkpoint's
// newest commit. A name committed before versions existed is read where it was then
// (rank-<r>/<name>). Throws LaunchFailure(74) when there is none.
storage::CommitRecord FindCommitted(storage::Destination& destination, const env::CheckpointReference& reference,
                                    const std::string& where) {
  const std::string job = destination.Describe() + "/" + reference.job_id;
  if (!reference.checkpoint_name) {
    auto latest = storage::ReadLatestCommit(destination, reference.job_id);
    if (!latest) throw LaunchFailure(kExitIo, where + "job " + reference.job_id + " has no committed checkpoint (no " + job + "/latest)");
    return *latest;
  }
  storage::ValidateCheckpointName(*reference.checkpoint_name, where + "checkpoint name");
  if (auto commit = storage::ReadCommit(destination, reference.job_id, *reference.checkpoint_name)) return *commit;
  return storage::CommitRecord::Unversioned(reference.job_id, *reference.checkpoint_name);
}

struct CommittedManifest {
  std::string path;       // of the manifest, under the destination
  std::string rank_root;  // what the manifest's paths are relative to
  int rank = -1;          // what the commit record says: who is missing when the manifest is
  std::string name;
  // What makes the record naming it no one save (CommitRecordProblems): every row of that
  // record fails --verify with them.
  std::vector<std::string> record_problems;
};

// Every committed part of every checkpoint of `job_id`: the versions the commit records
// name, and the manifests of checkpoints committed before versions existed. Uploaded
// versions no record names (a save not committed, or replaced by a later one) are not listed.
std::vector<CommittedManifest> CommittedManifests(storage::Destination& destination, const std::string& job_id) {
  std::vector<CommittedManifest> found;
  const std::string commits_dir = job_id + "/.bt-commits";
  for (const std::string& path : destination.List(commits_dir, ".json")) {
    auto text = destination.ReadText(commits_dir + "/" + path);
    if (!text) continue;
    storage::CommitRecord commit = storage::CommitRecord::FromText(*text, destination.Describe() + "/" + commits_dir + "/" + path);
    commit.job_id = job_id;
    const std::vector<std::string> problems = storage::CommitRecordProblems(commit);
    for (const auto& [rank, version] : commit.parts) {
      const std::string root = *storage::PartRoot(commit, rank);
      found.push_back({root + "/" + storage::ManifestName(commit.name), root, rank, commit.name, problems});
    }
  }
  for (const std::string& path : destination.List(job_id, storage::kManifestSuffix)) {
    if (path.find("/.bt-versions/") != std::string::npos) continue;
    found.push_back({job_id + "/" + path, job_id + "/" + path.substr(0, path.find('/')), -1, "", {}});  // listed: it is there
  }
  return found;
}

// A download with a line every kLoadLogEvery: how much of what, and at what rate.
void DownloadLogged(storage::Destination& destination, const std::string& remote_dir, const Manifest& manifest,
                    const std::string& local_dir, const std::string& what, const std::function<void()>& check_stop) {
  const auto started = std::chrono::steady_clock::now();
  auto last_log = started;
  destination.Download(remote_dir, FilePaths(manifest), local_dir, [&](uint64_t done) {
    check_stop();
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log < kLoadLogEvery) return;
    last_log = now;
    const double seconds = std::chrono::duration<double>(now - started).count();
    spdlog::info("loading {}: {} of {} ({}/s)", what, storage::FormatBytes(done), storage::FormatBytes(manifest.total_bytes),
                 storage::FormatBytes(uint64_t(double(done) / seconds)));
  });
}

}  // namespace

storage::DestinationSpec ResolveCheckpointDestination(const env::JobConfig& config,
                                                         const env::JobEnvironment& environment,
                                                         const std::optional<std::string>& root,
                                                         const std::optional<std::string>& uri_override) {
  const auto& settings = config.launcher.checkpoint;
  std::string uri;
  std::string origin;
  const auto& variables = environment.variables;
  auto from_env = variables.find("BT_CHECKPOINT_DESTINATION");
  if (uri_override) {
    uri = *uri_override;
    origin = "--destination";
  } else if (from_env != variables.end() && !from_env->second.empty()) {
    uri = from_env->second;
    origin = "BT_CHECKPOINT_DESTINATION";
  } else if (settings.destination) {
    uri = *settings.destination;
    origin = "launcher.checkpoint.destination";
  } else {
    uri = "file://" + env::PathLayout(root, 0).Shared(kDefaultDestinationDir);
    origin = "the default destination";
  }
  try {
    storage::DestinationSpec spec = storage::ParseDestination(uri, origin);
    std::optional<std::string> secret;
    if (settings.auth_secret_name) {
      secret = env::ReadSecretFile(environment.secrets_dir, *settings.auth_secret_name,
                                   "launcher.checkpoint.auth_secret_name");
    }
    spec.rclone_environ = storage::RcloneEnvironment(spec.scheme, secret, settings.auth_secret_name.value_or(""),
                                                        environment.variables);
    return spec;
  } catch (const DestinationError& error) {
    throw LaunchFailure(kExitConfig, error.what());
  } catch (const env::SecretError& error) {
    throw LaunchFailure(kExitConfig, error.what());
  }
}

namespace {

// The files of `manifest` that this node still holds, unchanged, under `local_dir` (the
// node restarted in place): hard-linked into `incoming` instead of downloaded. False when
// any is missing or differs; then nothing was linked.
bool LinkLocalCopy(const Manifest& manifest, const std::string& local_dir, const std::string& incoming) {
  if (local_dir.empty() || !CompareWithManifest(manifest, local_dir).empty()) return false;
  for (const auto& file : manifest.files) {
    const std::string to = incoming + "/" + file.path;
    storage::MakeDirectories(storage::ParentOf(to));
    std::error_code error;
    std::filesystem::create_hard_link(local_dir + "/" + file.path, to, error);
    if (error) std::filesystem::copy_file(local_dir + "/" + file.path, to);  // another filesystem
  }
  return true;
}

// This node's part of the committed version `commit` into `rank_dir`, verified. `local_root`
// is where this node wrote its own checkpoints ("" when it is another job's).
void LoadPart(storage::Destination& destination, const storage::DestinationSpec& destination_spec,
              const storage::CommitRecord& commit, int node_rank, const std::string& rank_dir, const std::string& local_root,
              const std::string& where, const std::function<void()>& check_stop) {
  const std::string& name = commit.name;
  const std::string& job_id = commit.job_id;
  storage::ValidateCheckpointName(name, where + "checkpoint name");
  // What `checkpoints --verify` refuses (parts of two cycles, a rank named in neither its
  // parts nor its "no part") is no one save: never loaded, and never taken for "no part".
  if (const std::vector<std::string> problems = storage::CommitRecordProblems(commit); !problems.empty()) {
    std::string all;
    for (const std::string& problem : problems) all += (all.empty() ? "" : "; ") + problem;
    throw LaunchFailure(kExitIo, where + "the commit record of checkpoint " + name + " of job " + job_id +
                                     " is not one save (" + all + "): not loaded");
  }
  const std::optional<std::string> part_root = storage::PartRoot(commit, node_rank);
  if (!part_root) {
    // The record says this node holds no part (DDP: only rank 0 saves): it runs with an
    // empty rank-<r>/, as the commit rule promises (docs/CHECKPOINTS.md).
    storage::MakeDirectories(rank_dir);
    spdlog::info("checkpoint {} of job {} has no part for node {} (its commit record lists none): {} is left empty", name,
                 job_id, node_rank, rank_dir);
    return;
  }
  const std::string remote_rank = *part_root;
  const std::string manifest_path = remote_rank + "/" + storage::ManifestName(name);
  auto text = destination.ReadText(manifest_path);
  if (!text) {
    throw LaunchFailure(kExitIo, where + "checkpoint " + name + " of job " + job_id + " has no part for node " +
                                     std::to_string(node_rank) + " (no " + destination_spec.uri + "/" + manifest_path + ")");
  }
  Manifest manifest = Manifest::FromJson(*text, destination_spec.uri + "/" + manifest_path);
  const std::string incoming = rank_dir + "/.bt-loading-" + std::to_string(getpid());
  storage::RemoveTree(incoming);
  storage::MakeDirectories(incoming);
  const std::string local_dir = local_root.empty() ? "" : storage::JoinPath(local_root, manifest.base());
  const bool reused = LinkLocalCopy(manifest, local_dir, incoming);
  try {
    if (!reused) {
      DownloadLogged(destination, storage::JoinPath(remote_rank, manifest.base()), manifest, incoming,
                     "checkpoint " + name + " of job " + job_id, check_stop);
    }
  } catch (...) {
    storage::RemoveTree(incoming);
    throw;
  }
  auto problems = reused ? std::vector<std::string>{} : CompareWithManifest(manifest, incoming);
  if (!problems.empty()) {
    storage::RemoveTree(incoming);
    throw LaunchFailure(kExitIo, where + "checkpoint " + name + " of job " + job_id + " is corrupt: " + problems.front() +
                                     (problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : ""));
  }
  const std::string target = storage::JoinPath(rank_dir, manifest.base());
  if (manifest.is_directory) storage::RemoveTree(target);
  for (const auto& file : manifest.files) {
    const std::string to = target + "/" + file.path;
    storage::MakeDirectories(storage::ParentOf(to));
    std::filesystem::rename(incoming + "/" + file.path, to);
  }
  storage::RemoveTree(incoming);
  // Renamed into place, never written through: a symlink at the pointer's path must
  // not carry the write into a verified file (the manifest cannot name one, see FromJson).
  for (const auto& [path, content] : manifest.pointers) storage::WriteFileAtomically(rank_dir + "/" + path, content);
  spdlog::info("loaded checkpoint {} of job {} ({} files, {} bytes, verified{}) into {}", name, job_id, manifest.files.size(),
               manifest.total_bytes, reused ? ", linked from this node's own copy" : "",
               storage::JoinPath(rank_dir, manifest.name));
}

// A read the destination failed (rclone killed, a connection reset) is tried again after a
// pause, twice: a job restarting after a crash must not end, or start from scratch, on one
// lost transfer. `what` and `uri` name it in the log; the last failure is thrown.
constexpr int kTransferAttempts = 3;
// Reading `latest` at the start decides between resuming and starting from scratch, and a
// failure ends the launch (74): a destination down for a while (a restarting object store)
// gets about half a minute of pauses (1 + 2 + ... + 7 s) before that.
constexpr int kLatestAtStartAttempts = 8;

template <typename Read>
auto RetryingTransfers(const std::string& what, const std::string& uri, Read read,
                       const std::function<void()>& check_stop, int attempts = kTransferAttempts) {
  for (int attempt = 1;; ++attempt) {
    try {
      return read();
    } catch (const DestinationError& error) {
      if (attempt == attempts) throw;
      spdlog::warn("{} from {} failed (attempt {} of {}): {}; trying again in {} s", what, uri, attempt,
                   attempts, error.what(), attempt);
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(attempt);
      while (std::chrono::steady_clock::now() < until) {
        check_stop();
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  }
}

// Every failure of a load as the launch failure (74) that names `where`. A corrupt or
// missing checkpoint is not tried again.
template <typename Load>
void AsLoadFailure(const std::string& where, const std::string& uri, Load load,
                   const std::function<void()>& check_stop = [] {}) {
  try {
    RetryingTransfers(where + "loading", uri, load, check_stop);
  } catch (const DestinationError& error) {
    throw LaunchFailure(kExitIo, where + "cannot load from " + uri + ": " + error.what());
  } catch (const ManifestError& error) {
    throw LaunchFailure(kExitIo, where + error.what());
  } catch (const std::filesystem::filesystem_error& error) {
    throw LaunchFailure(kExitIo, where + error.what());
  } catch (const LaunchFailure&) {
    throw;
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, where + error.what());
  }
}

std::string LoadRankDir(const env::JobEnvironment& environment, int node_rank) {
  return environment.variables.at("BT_LOAD_CHECKPOINT_DIR") + "/rank-" + std::to_string(node_rank);
}

}  // namespace

void ClearEarlierLoads(const env::JobEnvironment& environment, int node_rank) {
  if (!environment.variables.contains("BT_LOAD_CHECKPOINT_DIR")) return;
  const std::string rank_dir = LoadRankDir(environment, node_rank);
  std::error_code error;
  if (std::filesystem::is_empty(rank_dir, error) || error) return;  // absent, or nothing in it
  spdlog::info("checkpoints: emptying {} before loading into it: nothing else may lie beside what this job loads",
               rank_dir);
  storage::RemoveTree(rank_dir);
}

void LoadCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment,
                     const storage::DestinationSpec& destination_spec, int node_rank,
                     const std::function<void()>& check_stop) {
  const auto& loading = config.runtime.load_checkpoint_config;
  if (loading.checkpoints.empty()) {
    throw LaunchFailure(kExitConfig, "runtime.load_checkpoint_config.checkpoints: empty; name the job to load from "
                                     "({\"typ\": \"baseten_latest_checkpoint\", \"job_id\": ...})");
  }
  auto destination = storage::OpenDestination(destination_spec);
  const std::string rank_dir = LoadRankDir(environment, node_rank);
  for (const env::CheckpointReference& reference : loading.checkpoints) {
    const std::string where = reference.config_path + ": ";
    AsLoadFailure(where, destination_spec.uri, [&] {
      const storage::CommitRecord commit = FindCommitted(*destination, reference, where);
      LoadPart(*destination, destination_spec, commit, node_rank, rank_dir, "", where, check_stop);
    }, check_stop);
  }
}

std::optional<storage::CommitRecord> ReadLatestCommitted(const storage::DestinationSpec& destination_spec,
                                                         const std::string& job_id,
                                                         const std::function<void()>& check_stop) {
  // A spool is written for a sidecar, never read back: this job has nothing here to resume
  // from, which is not a destination that failed to answer.
  if (destination_spec.scheme == "spool") {
    spdlog::info("checkpoints: {} is a spool (the sidecar owns what was uploaded): not resuming from it", destination_spec.uri);
    return std::nullopt;
  }
  const std::string where = destination_spec.uri + "/" + job_id + "/latest";
  try {
    return RetryingTransfers("reading " + job_id + "/latest", destination_spec.uri, [&] {
      return storage::ReadLatestCommit(*storage::OpenDestination(destination_spec), job_id);
    }, check_stop, kLatestAtStartAttempts);
  } catch (const DestinationError& error) {
    throw LaunchFailure(kExitIo, "cannot read " + where + " after " + std::to_string(kLatestAtStartAttempts) + " attempts (" +
                                     error.what() + "): not starting from scratch over this job's committed checkpoints; "
                                     "the job can be run again once the destination answers");
  } catch (const ManifestError& error) {
    throw LaunchFailure(kExitIo, std::string(error.what()) + ": not starting from scratch over this job's committed "
                                                            "checkpoints");
  }
}

void LoadOwnCheckpoint(const env::JobEnvironment& environment, const storage::DestinationSpec& destination_spec,
                       int node_rank, const storage::CommitRecord& commit, const std::function<void()>& check_stop) {
  const std::string rank_dir = LoadRankDir(environment, node_rank);
  const std::string where = "resuming from checkpoint " + commit.name + ": ";
  AsLoadFailure(where, destination_spec.uri, [&] {
    storage::RemoveTree(rank_dir);  // an earlier cycle's load must not lie beside this one
    storage::MakeDirectories(rank_dir);
    auto found = environment.variables.find("BT_CHECKPOINT_DIR");
    const std::string local_root = found == environment.variables.end() ? "" : found->second;
    auto destination = storage::OpenDestination(destination_spec);
    // Exactly the versions the record names, never the name's commit now: a save committed
    // since (under the same name) must not give nodes of one cycle different versions.
    LoadPart(*destination, destination_spec, commit, node_rank, rank_dir, local_root, where, check_stop);
  }, check_stop);
}

namespace {

// A follower's agent answers the saves node 0 resumed before this node's training starts
// (CommitBoard): node 0 declares them as its agent starts, right after the ready barrier, as
// this node gets here. Waited for in slices, so that a signal or a lost node still stops the
// launcher at once; past the bound the agent answers them as they come.
void WaitForResumedDeclarations(rendezvous::Store& store, const std::function<void()>& check_stop) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    try {
      store.Get(kResumedDeclarationsKey, std::chrono::milliseconds(250));
      return;
    } catch (const rendezvous::StoreTimeout&) {
      check_stop();
    } catch (const rendezvous::StoreError&) {
      check_stop();  // a lost node 0 is named by the peers' verdict, when one came
      return;        // else the agent finds the store broken and says so
    }
  }
}

}  // namespace

CheckpointPhase StartCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment,
                                 const storage::DestinationSpec& destination, const env::NodeIdentity& identity,
                                 rendezvous::Store* store, const std::function<void()>& check_stop,
                                 int64_t incarnation, std::function<void(const storage::CommitRecord&)> on_latest,
                                 std::shared_ptr<checkpoint::CommitGate> commit_gate,
                                 std::function<std::vector<int>()> absent_ranks, bool serves_the_store) {
  CheckpointPhase phase;
  if (!config.runtime.checkpointing_config.enabled) return phase;
  checkpoint::AgentOptions options;
  options.checkpoint_dir = environment.variables.at("BT_CHECKPOINT_DIR");
  options.settings = config.launcher.checkpoint;
  options.job_id = environment.variables.at("BT_TRAINING_JOB_ID");
  options.node_rank = identity.rank;
  options.node_count = identity.count;
  options.destination = destination;
  options.uploader_environ = destination.rclone_environ;
  options.uploader_binary = storage::CurrentExecutable();
  options.incarnation = incarnation;
  if (identity.rank == 0 && serves_the_store) options.commit_gate = std::move(commit_gate);
  if (identity.rank == 0 && serves_the_store) options.absent_ranks = std::move(absent_ranks);
  options.resume_point_read = true;  // RunPhases reads it before this phase (ResumePoint)
  auto load_dir = environment.variables.find("BT_LOAD_CHECKPOINT_DIR");
  if (load_dir != environment.variables.end()) options.load_dir = load_dir->second;
  options.on_latest = std::move(on_latest);
  if (identity.count > 1 && store != nullptr) {
    phase.board = MakeStoreCommitBoard(*store, identity.count, identity.rank, incarnation);
    options.board = phase.board.get();
    if (identity.rank == 0 && !serves_the_store) {
      // Rank 0 on a spare: node 0's decisions and absent ranks are read through the store.
      options.commits_through_board = true;
      options.commit_lease =
          std::chrono::milliseconds(int64_t(config.launcher.rendezvous.heartbeat_timeout_s * 1000 / 2));
      options.absent_ranks = [board = phase.board.get()] { return board->AbsentRanks(); };
    }
    if (identity.rank != 0) WaitForResumedDeclarations(*store, check_stop);
  } else if (identity.count > 1) {
    spdlog::warn("checkpoints: the mpi rendezvous backend has no store during the run, so nodes cannot agree on "
                 "`latest`: node 0 writes it from its own part only");
    options.publish_latest = identity.rank == 0;
  }
  try {
    phase.agent = std::make_unique<checkpoint::CheckpointAgent>(std::move(options));
  } catch (const std::runtime_error& error) {
    throw LaunchFailure(kExitIo, std::string("cannot start checkpoint handling: ") + error.what());
  }
  return phase;
}

bool DrainCheckpoints(CheckpointPhase& phase, const env::JobConfig& config, const JobOutcome& outcome,
                      checkpoint::LeaderLoss leader_loss) {
  if (!phase.agent) return true;
  const bool succeeded = outcome.exit_code == 0 && !outcome.stop_reason && !outcome.shutdown_signal;
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(int64_t(config.launcher.checkpoint.drain_timeout_s * 1000));
  checkpoint::DrainResult result = phase.agent->Drain(succeeded, deadline, std::move(leader_loss));
  if (result.committed) {
    spdlog::info("checkpoints: {}", result.message);
  } else {
    spdlog::error("checkpoints: {}", result.message);
  }
  return result.committed;
}

namespace {

// The listing's row for a committed part without its manifest, with the error logged.
nlohmann::json MissingManifestRow(const CommittedManifest& committed, const std::string& uri,
                                  const std::optional<std::string>& latest, bool verify) {
  const std::string problem = "the manifest " + uri + "/" + committed.path + " of node " + std::to_string(committed.rank) +
                              "'s committed part is missing";
  spdlog::error("checkpoint {}: {}", committed.name, problem);
  nlohmann::json row = {{"rank", committed.rank}, {"name", committed.name}, {"layout", "?"},
                        {"files", 0},            {"bytes", 0},            {"committed_at", "?"},
                        {"latest", latest == committed.name}};
  if (verify) {
    row["verified"] = false;
    row["problems"] = {problem};
  }
  return row;
}

}  // namespace

int ListCheckpoints(const env::JobConfig& config, const env::JobEnvironment& environment, const CliOptions& cli) {
  const std::string job_id = cli.job_id.value_or(environment.variables.at("BT_TRAINING_JOB_ID"));
  try {
    env::ValidateJobId(job_id, cli.job_id ? "--job-id" : "BT_TRAINING_JOB_ID");
  } catch (const env::ConfigError& error) {
    throw LaunchFailure(kExitConfig, error.what());
  }
  storage::DestinationSpec spec = ResolveCheckpointDestination(config, environment, cli.root, cli.destination);
  auto destination = storage::OpenDestination(spec);
  nlohmann::json rows = nlohmann::json::array();
  std::optional<std::string> latest;
  bool all_verified = true;
  try {
    if (auto commit = storage::ReadLatestCommit(*destination, job_id)) latest = commit->name;
    for (const CommittedManifest& committed : CommittedManifests(*destination, job_id)) {
      auto text = destination->ReadText(committed.path);
      if (!text) {
        // A committed part whose manifest is gone cannot be loaded: never left out as if
        // there were nothing to verify.
        rows.push_back(MissingManifestRow(committed, spec.uri, latest, cli.verify));
        all_verified &= !cli.verify;
        continue;
      }
      Manifest manifest = Manifest::FromJson(*text, spec.uri + "/" + committed.path);
      nlohmann::json row = {{"rank", manifest.node_rank},        {"name", manifest.name},
                            {"layout", manifest.layout},         {"files", manifest.files.size()},
                            {"bytes", manifest.total_bytes},     {"committed_at", IsoTime(manifest.created_unix)},
                            {"latest", latest == manifest.name}};
      if (cli.verify) {
        std::string temporary = storage::TemporaryTemplate("bt-launch-verify");
        if (mkdtemp(temporary.data()) == nullptr) throw std::runtime_error("cannot create " + temporary);
        const std::string remote = storage::JoinPath(committed.rank_root, manifest.base());
        std::vector<std::string> problems;
        try {
          destination->Download(remote, FilePaths(manifest), temporary, [](uint64_t) {});
          problems = CompareWithManifest(manifest, temporary);
        } catch (const DestinationError& error) {
          problems.push_back(error.what());
        }
        storage::RemoveTree(temporary);
        if (manifest.name != committed.name && !committed.name.empty()) {
          problems.push_back("the manifest names checkpoint " + manifest.name + ", the commit record " + committed.name);
        }
        if (committed.rank >= 0 && manifest.node_rank != committed.rank) {
          problems.push_back("the manifest is node " + std::to_string(manifest.node_rank) + "'s, the commit record says node " +
                             std::to_string(committed.rank) + "'s");
        }
        for (const std::string& problem : committed.record_problems) {
          spdlog::error("checkpoint {}: its commit record is no one save: {}", committed.name, problem);
          problems.push_back("commit record: " + problem);
        }
        row["verified"] = problems.empty();
        row["problems"] = problems;
        all_verified &= problems.empty();
      }
      rows.push_back(row);
    }
  } catch (const DestinationError& error) {
    throw LaunchFailure(kExitIo, "cannot read " + spec.uri + ": " + error.what());
  } catch (const ManifestError& error) {
    throw LaunchFailure(kExitIo, error.what());
  }
  if (cli.output_format == "json") {
    nlohmann::json out = {{"job_id", job_id}, {"destination", spec.uri}, {"latest", latest ? nlohmann::json(*latest) : nlohmann::json()},
                          {"checkpoints", rows}};
    // Display only: a name that is not UTF-8 is shown with U+FFFD rather than ending the listing.
    std::printf("%s\n", out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("job %s at %s; latest: %s\n", job_id.c_str(), spec.uri.c_str(), latest ? latest->c_str() : "(none)");
    std::printf("%-5s %-40s %-13s %7s %14s  %-20s%s\n", "rank", "checkpoint", "layout", "files", "bytes", "committed at",
                cli.verify ? "  verified" : "");
    for (const auto& row : rows) {
      std::string verified;
      if (cli.verify) verified = row["verified"].get<bool>() ? "  ok" : "  MISMATCH: " + row["problems"][0].get<std::string>();
      std::printf("%-5d %-40s %-13s %7zu %14llu  %-20s%s%s\n", row["rank"].get<int>(), row["name"].get<std::string>().c_str(),
                  row["layout"].get<std::string>().c_str(), row["files"].get<size_t>(),
                  static_cast<unsigned long long>(row["bytes"].get<uint64_t>()),
                  row["committed_at"].get<std::string>().c_str(), row["latest"].get<bool>() ? " *" : "", verified.c_str());
    }
  }
  return all_verified ? 0 : kExitIo;
}

}  // namespace bt::launcher
