#include "storage/commit_record.h"

#include <nlohmann/json.hpp>

#include "storage/hash.h"
#include "storage/json_bytes.h"
#include "storage/manifest.h"

namespace bt::storage {
namespace {

std::string RankRoot(const std::string& job_id, int rank) { return job_id + "/rank-" + std::to_string(rank); }

// `latest` is one line; anything after the name (a newline written with it) is not part of it.
std::string FirstLine(const std::string& text) { return text.substr(0, text.find_first_of("\r\n")); }

const nlohmann::json& Field(const nlohmann::json& value, const char* key, const std::string& origin) {
  if (!value.contains(key)) throw ManifestError(origin + ": the commit record has no `" + key + "`");
  return value.at(key);
}

}  // namespace

CommitRecord CommitRecord::Unversioned(const std::string& job_id, const std::string& name) {
  CommitRecord record;
  record.job_id = job_id;
  record.name = name;
  record.unversioned = true;
  return record;
}

std::string CommitRecord::ToText() const {
  nlohmann::json versions = nlohmann::json::object();
  for (const auto& [rank, version] : parts) versions[std::to_string(rank)] = version;
  nlohmann::json value = {{"format", kCommitFormat}, {"job_id", job_id}, {"name", BytesToJson(name)}, {"parts", versions}};
  if (rank_count == 0) return value.dump(2) + "\n";
  value["format"] = kCommitFormatWithSave;
  value["save"] = save;
  value["cycle"] = cycle;
  value["ranks"] = rank_count;
  value["no_part"] = no_part;
  nlohmann::json cycles = nlohmann::json::object();
  for (const auto& [rank, part_cycle] : part_cycles) cycles[std::to_string(rank)] = part_cycle;
  value["part_cycles"] = cycles;
  return value.dump(2) + "\n";
}

namespace {

// Format 2's fields about the save; `format` 1 has none.
void ReadSave(const nlohmann::json& value, CommitRecord& record, const std::string& origin) {
  record.save = Field(value, "save", origin).get<std::string>();
  record.cycle = Field(value, "cycle", origin).get<int64_t>();
  record.rank_count = Field(value, "ranks", origin).get<int>();
  if (record.rank_count <= 0) throw ManifestError(origin + ": ranks: not a positive count");
  for (const auto& rank : Field(value, "no_part", origin)) record.no_part.insert(rank.get<int>());
  const nlohmann::json& cycles = Field(value, "part_cycles", origin);
  if (!cycles.is_object()) throw ManifestError(origin + ": part_cycles: not an object");
  for (const auto& [rank, part_cycle] : cycles.items()) record.part_cycles[std::stoi(rank)] = part_cycle.get<int64_t>();
}

}  // namespace

CommitRecord CommitRecord::FromText(const std::string& text, const std::string& origin) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (!value.is_object()) throw ManifestError(origin + ": the commit record is not a JSON object");
  const auto format_field = value.find("format");
  const std::string format = format_field != value.end() && format_field->is_string() ? format_field->get<std::string>() : "";
  if (format != kCommitFormat && format != kCommitFormatWithSave) {
    throw ManifestError(origin + ": format is not " + std::string(kCommitFormat) + " or " + kCommitFormatWithSave);
  }
  CommitRecord record;
  try {
    record.job_id = Field(value, "job_id", origin).get<std::string>();
    record.name = BytesFromJson(Field(value, "name", origin));
    const nlohmann::json& parts = Field(value, "parts", origin);
    if (!parts.is_object()) throw ManifestError(origin + ": parts: not an object");
    for (const auto& [rank, version] : parts.items()) {
      const std::string id = version.get<std::string>();
      if (id.empty() || id.find('/') != std::string::npos || id.front() == '.') {
        throw ManifestError(origin + ": parts." + rank + ": not a version id: " + id);
      }
      record.parts[std::stoi(rank)] = id;
    }
    if (format == kCommitFormatWithSave) ReadSave(value, record, origin);
  } catch (const nlohmann::json::exception& error) {
    throw ManifestError(origin + ": " + error.what());
  } catch (const std::logic_error&) {  // std::stoi: a key that is not a rank
    throw ManifestError(origin + ": parts: a key is not a node rank");
  }
  ValidateCheckpointName(record.name, origin + ": name");
  return record;
}

std::vector<std::string> CommitRecordProblems(const CommitRecord& commit) {
  std::vector<std::string> problems;
  if (commit.rank_count == 0 || commit.unversioned) return problems;
  const std::string save = "save " + commit.save + " (cycle " + std::to_string(commit.cycle) + ")";
  for (int rank = 0; rank < commit.rank_count; ++rank) {
    const bool part = commit.parts.contains(rank);
    const bool none = commit.no_part.contains(rank);
    if (!part && !none) problems.push_back("rank " + std::to_string(rank) + " has neither a part nor \"no part\" in " + save);
    if (part && none) problems.push_back("rank " + std::to_string(rank) + " has both a part and \"no part\" in " + save);
  }
  for (const auto& [rank, version] : commit.parts) {
    if (rank < 0 || rank >= commit.rank_count) {
      problems.push_back("rank " + std::to_string(rank) + " is not one of the job's " + std::to_string(commit.rank_count));
    }
    auto part_cycle = commit.part_cycles.find(rank);
    if (part_cycle == commit.part_cycles.end()) {
      problems.push_back("rank " + std::to_string(rank) + "'s part does not say which cycle it was written in");
    } else if (part_cycle->second != commit.cycle) {
      problems.push_back("rank " + std::to_string(rank) + "'s part was written in cycle " + std::to_string(part_cycle->second) +
                         ", not in the cycle of " + save);
    }
  }
  return problems;
}

std::string CommitRecordPath(const std::string& job_id, const std::string& name) {
  return job_id + "/.bt-commits/" + HashBytes(name.data(), name.size()) + ".json";
}

std::string VersionRoot(const std::string& job_id, int node_rank, const std::string& version) {
  return RankRoot(job_id, node_rank) + "/.bt-versions/" + version;
}

std::optional<std::string> PartRoot(const CommitRecord& commit, int rank) {
  if (commit.unversioned) return RankRoot(commit.job_id, rank);
  auto part = commit.parts.find(rank);
  if (part == commit.parts.end()) return std::nullopt;
  return VersionRoot(commit.job_id, rank, part->second);
}

std::optional<CommitRecord> ReadCommit(Destination& destination, const std::string& job_id, const std::string& name) {
  const std::string path = CommitRecordPath(job_id, name);
  auto text = destination.ReadText(path);
  if (!text) return std::nullopt;
  CommitRecord record = CommitRecord::FromText(*text, destination.Describe() + "/" + path);
  record.job_id = job_id;  // where it was read: a job's tree copied under another id still loads
  if (record.name != name) {
    throw ManifestError(destination.Describe() + "/" + path + ": names checkpoint " + record.name + ", not " + name);
  }
  return record;
}

std::optional<CommitRecord> ReadLatestCommit(Destination& destination, const std::string& job_id) {
  auto latest = destination.ReadText(job_id + "/latest");
  if (!latest) return std::nullopt;
  const std::string name = FirstLine(*latest);
  ValidateCheckpointName(name, destination.Describe() + "/" + job_id + "/latest");
  if (auto record = ReadCommit(destination, job_id, name)) return record;
  return CommitRecord::Unversioned(job_id, name);
}

}  // namespace bt::storage
