#include "rendezvous/commit_keys.h"

#include <charconv>

#include <nlohmann/json.hpp>

namespace bt::rendezvous {
namespace {

std::optional<int64_t> Counter(const std::unordered_map<std::string, std::string>& table, const std::string& key) {
  auto it = table.find(key);
  if (it == table.end()) return std::nullopt;
  int64_t value = 0;
  const std::string& text = it->second;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// The JSON object stored at `key` with an integer `number_field` and a string "record".
std::optional<std::pair<int64_t, std::string>> Proposal(const std::unordered_map<std::string, std::string>& table,
                                                        const std::string& key, const char* number_field) {
  auto it = table.find(key);
  if (it == table.end()) return std::nullopt;
  const nlohmann::json value = nlohmann::json::parse(it->second, nullptr, false);
  if (!value.is_object()) return std::nullopt;
  auto number = value.find(number_field);
  auto record = value.find("record");
  if (number == value.end() || !number->is_number_integer() || record == value.end() || !record->is_string()) {
    return std::nullopt;
  }
  return std::make_pair(number->get<int64_t>(), record->get<std::string>());
}

}  // namespace

std::string CommitProposalKey(uint64_t declaration) { return "bt/ckpt/commit/" + std::to_string(declaration); }
std::string CommitStateKey(uint64_t declaration) { return CommitProposalKey(declaration) + "/state"; }

RemoteCommits SealRemoteCommits(std::unordered_map<std::string, std::string>& table, int64_t cycle, int64_t declared) {
  RemoteCommits commits;
  std::optional<std::pair<int64_t, std::string>> newest_on_its_way;  // (declaration, record)
  for (int64_t number = 0; number < declared; ++number) {
    const std::string state_key = CommitStateKey(uint64_t(number));
    const std::optional<int64_t> state = Counter(table, state_key);
    if (!state || *state >= kCommitSealed || *state >= 2) continue;  // none, sealed before, or written
    const auto proposal = Proposal(table, CommitProposalKey(uint64_t(number)), "cycle");
    if (!proposal || proposal->first > cycle) continue;  // a save of a later cycle is not this decision's
    table[state_key] = std::to_string(*state + kCommitSealed);
    if (*state == 1) newest_on_its_way = std::make_pair(number, proposal->second);
  }
  const auto latest = Proposal(table, kCommitLatestKey, "declaration");
  if (latest) commits.latest = latest->second;
  if (newest_on_its_way && (!latest || newest_on_its_way->first > latest->first)) {
    commits.on_its_way = newest_on_its_way->second;
  }
  return commits;
}

}  // namespace bt::rendezvous
