#include "rendezvous/commit_keys.h"

#include <charconv>

#include <nlohmann/json.hpp>

namespace bt::rendezvous {
namespace {

constexpr std::string_view kCommitPrefix = "bt/ckpt/commit/";

std::optional<int64_t> Integer(std::string_view text) {
  int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<int64_t> Counter(const std::unordered_map<std::string, std::string>& table, const std::string& key) {
  auto it = table.find(key);
  if (it == table.end()) return std::nullopt;
  return Integer(it->second);
}

// The JSON object stored at `key` with an integer `number_field` and a string "record".
std::optional<std::pair<int64_t, std::string>> NumberedRecord(const std::unordered_map<std::string, std::string>& table,
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

std::string CommitProposalKey(uint64_t declaration) { return std::string(kCommitPrefix) + std::to_string(declaration); }
std::string CommitStateKey(uint64_t declaration, int64_t cycle) {
  return CommitProposalKey(declaration) + "/" + std::to_string(cycle);
}

bool BornSealed(std::string_view key, int64_t sealed_through) {
  if (!key.starts_with(kCommitPrefix)) return false;
  key.remove_prefix(kCommitPrefix.size());
  const size_t slash = key.find('/');
  if (slash == std::string_view::npos || !Integer(key.substr(0, slash))) return false;
  const std::optional<int64_t> cycle = Integer(key.substr(slash + 1));
  return cycle && *cycle <= sealed_through;
}

std::string DeclarationKey(uint64_t declaration) { return std::string(kCommitDeclaredKey) + "/" + std::to_string(declaration); }
std::string OutcomeKey(uint64_t declaration) { return "bt/ckpt/outcome/" + std::to_string(declaration); }

void SettleLostLeadersSaves(std::unordered_map<std::string, std::string>& table, int64_t since, int64_t cycle,
                            int64_t declared) {
  for (int64_t number = 0; number < declared; ++number) {
    auto declaration = table.find(DeclarationKey(uint64_t(number)));
    if (declaration == table.end()) continue;
    const nlohmann::json value = nlohmann::json::parse(declaration->second, nullptr, false);
    const auto save_cycle = value.is_object() ? value.find("cycle") : value.end();
    if (save_cycle == value.end() || !save_cycle->is_number_integer()) continue;
    if (save_cycle->get<int64_t>() < since || save_cycle->get<int64_t>() > cycle) continue;
    const std::string state_key = CommitStateKey(uint64_t(number), save_cycle->get<int64_t>());
    const std::optional<int64_t> state = Counter(table, state_key);
    if (state == 1) table[state_key] = std::to_string(1 + kCommitSealed);
    const std::string outcome_key = OutcomeKey(uint64_t(number));
    if (Counter(table, outcome_key).value_or(0) != 0) continue;
    table[outcome_key] = std::to_string(state == 2 ? kOutcomeCommitted : kOutcomeAbandoned);
  }
}

std::optional<int64_t> HandedOverCycle(std::string_view text) { return Integer(text); }

void MarkHandedOver(std::unordered_map<std::string, std::string>& table, int64_t cycle) {
  auto handed_over = table.find(kHandedOverKey);
  const int64_t before = handed_over == table.end() ? 0 : Integer(handed_over->second).value_or(0);
  table[kHandedOverKey] = std::to_string(std::max(before, cycle));
}

RemoteCommits ReadRemoteCommits(const std::unordered_map<std::string, std::string>& table, int64_t cycle,
                                int64_t declared) {
  RemoteCommits commits;
  std::optional<std::pair<int64_t, std::string>> newest_on_its_way;  // (declaration, record)
  for (int64_t number = 0; number < declared; ++number) {
    const auto proposal = NumberedRecord(table, CommitProposalKey(uint64_t(number)), "cycle");
    if (!proposal || proposal->first > cycle) continue;  // none, or a save of a later cycle: not this decision's
    if (Counter(table, CommitStateKey(uint64_t(number), proposal->first)) == 1) {
      newest_on_its_way = std::make_pair(number, proposal->second);
    }
  }
  const auto latest = NumberedRecord(table, kCommitLatestKey, "declaration");
  if (latest) commits.latest = latest->second;
  if (newest_on_its_way && (!latest || newest_on_its_way->first > latest->first)) {
    commits.on_its_way = newest_on_its_way->second;
  }
  return commits;
}

}  // namespace bt::rendezvous
