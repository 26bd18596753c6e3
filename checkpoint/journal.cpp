#include "checkpoint/journal.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <fstream>

#include <spdlog/spdlog.h>

#include "storage/durable_file.h"
#include "storage/json_bytes.h"

namespace bt::checkpoint {
namespace {

constexpr HandoffState kStates[] = {HandoffState::kSnapshotted, HandoffState::kUploaded, HandoffState::kCommitted,
                                    HandoffState::kAbandoned};

std::optional<HandoffState> StateFromName(const std::string& name) {
  for (HandoffState state : kStates) {
    if (name == HandoffStateName(state)) return state;
  }
  return std::nullopt;
}

}  // namespace

const char* HandoffStateName(HandoffState state) {
  switch (state) {
    case HandoffState::kSnapshotted: return "snapshotted";
    case HandoffState::kUploaded: return "uploaded";
    case HandoffState::kCommitted: return "committed";
    case HandoffState::kAbandoned: return "abandoned";
  }
  return "?";
}

HandoffJournal::HandoffJournal(std::string path) : path_(std::move(path)) {
  Replay();
  fd_ = open(path_.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error("cannot open the checkpoint journal " + path_ + ": " + std::strerror(errno));
  EndTornLine();
}

// A launcher killed mid-append leaves a last line without its newline: the next record
// would be appended to it, and skipped with it by every later replay.
void HandoffJournal::EndTornLine() {
  struct stat info {};
  char last = '\n';
  if (fstat(fd_, &info) != 0 || info.st_size == 0 || pread(fd_, &last, 1, info.st_size - 1) != 1 || last == '\n') return;
  storage::WriteAll(fd_, "\n", "the checkpoint journal " + path_);
}

HandoffJournal::~HandoffJournal() {
  if (fd_ >= 0) close(fd_);
}

void HandoffJournal::SetScope(std::string job_id, std::string destination) {
  job_id_ = std::move(job_id);
  destination_ = std::move(destination);
}

void HandoffJournal::Replay() {
  std::ifstream file(path_);
  std::string line;
  size_t number = 0;
  while (std::getline(file, line)) {
    ++number;
    try {
      auto value = nlohmann::json::parse(line);
      if (value.contains("started")) {
        started_.emplace(value.at("job_id").get<std::string>(), value.at("destination").get<std::string>());
        continue;
      }
      JournalEntry entry;
      entry.seq = value.at("seq").get<uint64_t>();
      entry.job_id = value.at("job_id").get<std::string>();
      entry.destination = value.at("destination").get<std::string>();
      entry.name = storage::BytesFromJson(value.at("name"));
      auto state = StateFromName(value.at("state").get<std::string>());
      if (!state) throw std::runtime_error("unknown state");
      entry.state = *state;
      entry.detail = value.contains("detail") ? storage::BytesFromJson(value["detail"]) : "";
      auto previous = entries_.find(entry.seq);
      if (value.contains("snapshot")) {
        entry.snapshot = Snapshot::FromJson(value["snapshot"]);
      } else if (previous != entries_.end()) {
        entry.snapshot = previous->second.snapshot;
      }
      if (value.contains("answers") && entry.snapshot) entry.snapshot->answers = value["answers"].get<std::string>();
      next_seq_ = std::max(next_seq_, entry.seq + 1);
      entries_[entry.seq] = std::move(entry);
    } catch (const std::exception& error) {
      spdlog::warn("checkpoint journal {}: line {} is not a record ({}); skipping it", path_, number, error.what());
    }
  }
}

void HandoffJournal::Record(uint64_t seq, const std::string& name, HandoffState state, const std::string& detail,
                            const std::optional<Snapshot>& snapshot) {
  Append(seq, name, state, detail, snapshot);
  Sync();
}

void HandoffJournal::Sync() {
  if (fdatasync(fd_) != 0) throw std::runtime_error("cannot sync the checkpoint journal " + path_ + ": " + std::strerror(errno));
}

nlohmann::json HandoffJournal::Line(uint64_t seq, const std::string& name, HandoffState state) const {
  return {{"seq", seq},
          {"job_id", job_id_},
          {"destination", destination_},
          {"name", storage::BytesToJson(name)},
          {"state", HandoffStateName(state)},
          {"at", int64_t(std::time(nullptr))}};
}

void HandoffJournal::Append(uint64_t seq, const std::string& name, HandoffState state, const std::string& detail,
                            const std::optional<Snapshot>& snapshot) {
  nlohmann::json line = Line(seq, name, state);
  if (!detail.empty()) line["detail"] = storage::BytesToJson(detail);
  if (snapshot) line["snapshot"] = snapshot->ToJson();
  AppendLine(line.dump() + "\n");
  JournalEntry& entry = entries_[seq];
  entry.seq = seq;
  entry.job_id = job_id_;
  entry.destination = destination_;
  entry.name = name;
  entry.state = state;
  entry.detail = detail;
  if (snapshot) entry.snapshot = snapshot;
  next_seq_ = std::max(next_seq_, seq + 1);
}

// A write cut short (ENOSPC) leaves no part of its line: the journal stays one record a
// line, and the next append, once there is room, is read back whole.
void HandoffJournal::AppendLine(const std::string& text) {
  const off_t end = lseek(fd_, 0, SEEK_END);
  try {
    storage::WriteAll(fd_, text, "the checkpoint journal " + path_);
  } catch (const std::runtime_error&) {
    if (end >= 0 && ftruncate(fd_, end) != 0) {
      spdlog::warn("checkpoint journal {}: cannot remove a record cut short: {}", path_, std::strerror(errno));
    }
    throw;
  }
}

void HandoffJournal::RecordAnswers(uint64_t seq, const std::string& save) {
  JournalEntry& entry = entries_.at(seq);
  nlohmann::json line = Line(seq, entry.name, entry.state);
  line["answers"] = save;
  storage::WriteAll(fd_, line.dump() + "\n", "the checkpoint journal " + path_);
  Sync();
  if (entry.snapshot) entry.snapshot->answers = save;
}

bool HandoffJournal::Knows(const std::string& name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const auto& item) {
    const JournalEntry& entry = item.second;
    return entry.name == name && entry.job_id == job_id_ && entry.destination == destination_;
  });
}

std::vector<JournalEntry> HandoffJournal::Entries() const {
  std::vector<JournalEntry> scoped;
  for (const auto& [seq, entry] : entries_) {
    if (entry.job_id == job_id_ && entry.destination == destination_) scoped.push_back(entry);
  }
  return scoped;
}

bool HandoffJournal::RecordedAny() const {
  for (const auto& [seq, entry] : entries_) {
    if (entry.job_id == job_id_ && entry.destination == destination_) return true;
  }
  return false;
}

void HandoffJournal::RecordStart() {
  const nlohmann::json line = {{"started", true},
                               {"job_id", job_id_},
                               {"destination", destination_},
                               {"at", int64_t(std::time(nullptr))}};
  AppendLine(line.dump() + "\n");
  Sync();
  started_.emplace(job_id_, destination_);
}

bool HandoffJournal::StartedBefore() const { return started_.contains({job_id_, destination_}) || RecordedAny(); }

std::vector<JournalEntry> HandoffJournal::Unfinished() const {
  std::vector<JournalEntry> unfinished;
  for (const auto& entry : Entries()) {
    if ((entry.state == HandoffState::kSnapshotted || entry.state == HandoffState::kUploaded) && entry.snapshot) {
      unfinished.push_back(entry);
    }
  }
  return unfinished;
}

// Called for every candidate the agent has not handed off yet: reads the entries in place
// rather than copying every snapshot's file list as Entries() does.
bool HandoffJournal::Reached(const std::string& name, const std::string& fingerprint, HandoffState state) const {
  for (const auto& [seq, entry] : entries_) {
    if (entry.job_id != job_id_ || entry.destination != destination_) continue;
    if (entry.name != name || !entry.snapshot || entry.snapshot->fingerprint != fingerprint) continue;
    if (entry.state != HandoffState::kAbandoned && int(entry.state) >= int(state)) return true;
  }
  return false;
}

std::optional<std::string> HandoffJournal::CommittedByAnotherJob(const std::string& name,
                                                                 const std::string& fingerprint) const {
  for (const auto& [seq, entry] : entries_) {
    if (entry.job_id == job_id_ || entry.state != HandoffState::kCommitted) continue;
    if (entry.name == name && entry.snapshot && entry.snapshot->fingerprint == fingerprint) return entry.job_id;
  }
  return std::nullopt;
}

bool HandoffJournal::HoldsMoreThan(const Candidate& candidate) const {
  for (const auto& [seq, entry] : entries_) {
    if (entry.name != candidate.name || !entry.snapshot || entry.state == HandoffState::kAbandoned) continue;
    if (entry.snapshot->files.size() > candidate.files.size() && entry.snapshot->Holds(candidate)) return true;
  }
  return false;
}

}  // namespace bt::checkpoint
