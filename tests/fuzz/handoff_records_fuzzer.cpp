// libFuzzer target for the handoff's own records: the journal a restarted launcher replays
// from the checkpoint volume (`.bt-checkpoint/journal.jsonl`, snapshots inside), and the
// spool:// records and acknowledgements exchanged with a sidecar.
//  - Any bytes as a journal replay to entries or are skipped line by line (never an
//    exception, never a read outside a buffer); every snapshot replayed names only paths
//    inside its checkpoint, and writes back as it was read; a record appended after any
//    bytes (a torn last line included) is replayed.
//  - Any bytes as a spool acknowledgement are a success, a failure or a DestinationError.
//  - Any byte string carried as a name through the journal and the spool records comes back
//    byte for byte.
#include <stdlib.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "checkpoint/journal.h"
#include "checkpoint/snapshot.h"
#include "storage/commit_record.h"
#include "storage/destination.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"
#include "storage/paths.h"
#include "storage/spool.h"

namespace {

using namespace bt;

constexpr const char* kJob = "job";
constexpr const char* kDestination = "file:///remote";

// tmpfs when there is one: the journal syncs what it appends. Removed at exit.
const std::string& ScratchDir() {
  static const std::string dir = [] {
    std::string path_template = access("/dev/shm", W_OK) == 0 ? "/dev/shm/bt-fuzz.XXXXXX" : "/tmp/bt-fuzz.XXXXXX";
    if (mkdtemp(path_template.data()) == nullptr) std::abort();
    return path_template;
  }();
  return dir;
}

void RemoveScratchDir() { std::filesystem::remove_all(ScratchDir()); }

std::string WriteJournal(const std::string& bytes) {
  const std::string path = ScratchDir() + "/journal.jsonl";
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return path;
}

bool IsInside(const std::string& path) {
  try {
    storage::ValidateCheckpointName(path, "fuzz");
    return true;
  } catch (const storage::ManifestError&) {
    return false;
  }
}

void CheckSnapshot(const checkpoint::Snapshot& snapshot) {
  if (!IsInside(snapshot.name)) std::abort();
  for (const auto& file : snapshot.files) {
    if (!IsInside(file.path)) std::abort();
  }
  snapshot.Staged();
  snapshot.VersionId();
  const checkpoint::Snapshot again = checkpoint::Snapshot::FromJson(nlohmann::json::parse(snapshot.ToJson().dump()));
  if (again.name != snapshot.name || again.files.size() != snapshot.files.size() || again.pointers != snapshot.pointers ||
      again.staging_dir != snapshot.staging_dir || again.fingerprint != snapshot.fingerprint) {
    std::abort();
  }
}

// What a restarted launcher does with a journal it finds: replay it, resume what it holds,
// then append to it.
void ReplayJournal(const std::string& bytes) {
  using namespace checkpoint;
  const std::string path = WriteJournal(bytes);
  uint64_t next = 0;
  {
    HandoffJournal journal(path);
    journal.SetScope(kJob, kDestination);
    for (const JournalEntry& entry : journal.Entries()) {
      if (!entry.snapshot) continue;
      CheckSnapshot(*entry.snapshot);
      journal.Reached(entry.name, entry.snapshot->fingerprint, HandoffState::kUploaded);
      journal.CommittedByAnotherJob(entry.name, entry.snapshot->fingerprint);
      // The checkpoint as the watcher would see it again: paths relative to the root.
      Candidate candidate;
      candidate.name = entry.snapshot->name;
      candidate.is_directory = entry.snapshot->is_directory;
      const std::string base = candidate.is_directory ? candidate.name : storage::ParentOf(candidate.name);
      for (const auto& file : entry.snapshot->files) {
        candidate.files.push_back({storage::JoinPath(base, file.path), file.size, file.mtime_ns});
      }
      journal.HoldsMoreThan(candidate);
    }
    journal.Unfinished();
    next = journal.NextSeq();
    journal.Append(next, "checkpoint-appended", HandoffState::kCommitted);
  }
  HandoffJournal again(path);
  again.SetScope(kJob, kDestination);
  for (const JournalEntry& entry : again.Entries()) {
    if (entry.seq == next && entry.name == "checkpoint-appended" && entry.state == HandoffState::kCommitted) return;
  }
  std::abort();  // the record appended after these bytes was lost
}

void ReadAsSnapshot(const std::string& bytes) {
  const nlohmann::json value = nlohmann::json::parse(bytes, nullptr, false);
  if (value.is_discarded()) return;
  try {
    CheckSnapshot(checkpoint::Snapshot::FromJson(value));
  } catch (const nlohmann::json::exception&) {
  } catch (const storage::ManifestError&) {
  }
}

void JournalRoundTrip(const std::string& bytes) {
  using namespace checkpoint;
  const std::string path = WriteJournal("");
  Snapshot snapshot;
  snapshot.seq = 1;
  snapshot.name = IsInside(bytes) ? bytes : "checkpoint-1";
  snapshot.staging_dir = bytes;
  snapshot.files = {{IsInside(bytes) ? bytes : "model.bin", 1, 2, StagingMethod::kCopy}};
  snapshot.pointers = {{bytes, bytes}};
  snapshot.fingerprint = "fingerprint";
  {
    HandoffJournal journal(path);
    journal.SetScope(kJob, kDestination);
    journal.Append(1, bytes, HandoffState::kSnapshotted, bytes, snapshot);
  }
  HandoffJournal journal(path);
  journal.SetScope(kJob, kDestination);
  const auto entries = journal.Entries();
  if (entries.size() != 1 || entries[0].name != bytes || entries[0].detail != bytes || !entries[0].snapshot) std::abort();
  const Snapshot& read = *entries[0].snapshot;
  if (read.name != snapshot.name || read.staging_dir != bytes || read.files.at(0).path != snapshot.files[0].path ||
      read.pointers != snapshot.pointers) {
    std::abort();
  }
}

void ReadAsSpoolAck(const std::string& bytes) {
  try {
    storage::ReadSpoolAck(bytes, "fuzz.ack");
  } catch (const storage::DestinationError&) {
  }
}

// What a sidecar decodes from the records (docs/CHECKPOINTS.md, "Names are bytes").
void SpoolRoundTrip(const std::string& bytes) {
  using namespace storage;
  Manifest manifest;
  manifest.job_id = kJob;
  manifest.name = IsInside(bytes) ? bytes : "checkpoint-1";
  manifest.layout = "plain";
  manifest.files = {{IsInside(bytes) ? bytes : "model.bin", 1, "00"}};
  const nlohmann::json record =
      nlohmann::json::parse(SpoolCheckpointRecord(manifest, bytes, "job/rank-0/.bt-versions/v").dump(2));
  if (BytesFromJson(record.at("local_dir")) != bytes || BytesFromJson(record.at("name")) != manifest.name) std::abort();
  const Manifest read = Manifest::FromJson(record.at("manifest").dump(), "fuzz");
  if (read.name != manifest.name || read.files.at(0).path != manifest.files[0].path) std::abort();

  const CommitRecord commit{kJob, manifest.name, {{0, "aa"}, {3, "bb"}}};
  const nlohmann::json latest = nlohmann::json::parse(SpoolCommitRecord(commit, true).dump(2));
  const CommitRecord committed = CommitRecord::FromText(latest.at("commit").get<std::string>(), "fuzz");
  if (BytesFromJson(latest.at("name")) != commit.name || committed.name != commit.name || committed.parts != commit.parts) {
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);  // a skipped journal line is logged: not on every run
  ScratchDir();
  std::atexit(RemoveScratchDir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  ReplayJournal(bytes);
  ReadAsSnapshot(bytes);
  JournalRoundTrip(bytes);
  ReadAsSpoolAck(bytes);
  SpoolRoundTrip(bytes);
  return 0;
}
