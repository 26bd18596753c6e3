#include "launcher/phases/commit_board.h"

#include <chrono>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include "checkpoint/commit_rule.h"
#include "rendezvous/commit_keys.h"
#include "storage/json_bytes.h"

namespace bt::launcher {
namespace {

using checkpoint::CommitBoard;
using checkpoint::PartKind;

constexpr std::chrono::seconds kStoreGetTimeout{10};
constexpr const char* kDeclaredKey = rendezvous::kCommitDeclaredKey;
constexpr const char* kClosedKey = "bt/ckpt/closed";
constexpr const char* kDrainingKey = "bt/ckpt/draining";  // node 0's drain began

// Keyed by the declaration's number, not the checkpoint's name: a name saved again is a new
// declaration, and an answer to the first can never complete the second.
using rendezvous::DeclarationKey;
// One key per rank and per launcher of that rank: a replacement's answer never writes over
// its predecessor's, and node 0's rule decides which one counts.
std::string AnswerKey(uint64_t declaration, int rank, int64_t incarnation) {
  return "bt/ckpt/answer/" + std::to_string(declaration) + "/rank-" + std::to_string(rank) + "/joined-" +
         std::to_string(incarnation);
}
// The cycles in which the launchers of a rank joined after the first (a JSON array).
std::string LaunchersKey(int rank) { return "bt/ckpt/launchers/rank-" + std::to_string(rank); }
using rendezvous::OutcomeKey;

PartKind ParseKind(const std::string& text, const std::string& key) {
  if (text == "version") return PartKind::kVersion;
  if (text == "no part") return PartKind::kNoPart;
  if (text == "lost") return PartKind::kLost;
  throw std::runtime_error("the store's " + key + " is not a checkpoint answer: kind " + text);
}

class StoreCommitBoard final : public CommitBoard {
 public:
  StoreCommitBoard(rendezvous::Store& store, int node_count, int node_rank, int64_t incarnation)
      : store_(store), node_count_(node_count), node_rank_(node_rank), incarnation_(incarnation), rule_(node_count) {
    if (incarnation_ > 0) RegisterReplacement();
  }

  uint64_t Declare(const Declaration& declaration) override {
    nlohmann::json value = {{"name", storage::BytesToJson(declaration.name)},
                            {"save", declaration.save},
                            {"cycle", declaration.cycle}};
    if (declaration.resumed_age_ns) value["resumed_age_ns"] = *declaration.resumed_age_ns;
    const int64_t number = store_.Add(kDeclaredKey, 0);
    store_.Set(DeclarationKey(uint64_t(number)), value.dump());
    store_.Add(kDeclaredKey, 1);  // after the declaration: a reader never finds a gap
    rule_.Declare({uint64_t(number), declaration.name, declaration.save, declaration.cycle});
    return uint64_t(number);
  }

  std::vector<Declaration> DeclaredSince(uint64_t first) override {
    std::vector<Declaration> declarations;
    const int64_t count = store_.Add(kDeclaredKey, 0);
    for (int64_t number = int64_t(first); number < count; ++number) {
      const std::string key = DeclarationKey(uint64_t(number));
      declarations.push_back(ParseDeclaration(uint64_t(number), store_.Get(key, kStoreGetTimeout), key));
    }
    return declarations;
  }

  void FinishResumedDeclarations() override { store_.Set(kResumedDeclarationsKey, "1"); }
  bool ResumedDeclared() override { return store_.Peek({kResumedDeclarationsKey}).front().has_value(); }

  void ReportPart(uint64_t declaration, PartKind kind, const std::string& version, int64_t cycle) override {
    nlohmann::json value = {{"kind", checkpoint::PartKindName(kind)}, {"cycle", cycle}};
    if (kind == PartKind::kVersion) value["version"] = version;
    // One answer per launcher: its first stands (this launcher is the key's only writer).
    const std::string key = AnswerKey(declaration, node_rank_, incarnation_);
    if (store_.Peek({key}).front()) return;
    store_.Set(key, value.dump());
  }

  // Replacements first, then answers: an answer of a launcher replaced meanwhile is not taken
  // (its rank's part of that save is lost), which never commits what should not be.
  std::optional<checkpoint::SaveState> Decide(uint64_t declaration) override {
    if (rule_.Find(declaration) == nullptr) return std::nullopt;
    ReadReplacements();
    ReadAnswers(declaration);
    return *rule_.Find(declaration);
  }

  void Restart(int64_t cycle) override { rule_.Restart(cycle); }

  // One counter per declaration: 1 committed, 2 abandoned (Add is the store's atomic write;
  // node 0's server settles the saves of a lost leader on a spare the same way).
  void SetOutcome(uint64_t declaration, Outcome outcome) override {
    if (GetOutcome(declaration) == Outcome::kPending) store_.Add(OutcomeKey(declaration), int64_t(outcome));
  }
  Outcome GetOutcome(uint64_t declaration) override {
    const int64_t value = store_.Add(OutcomeKey(declaration), 0);
    return value == 1 ? Outcome::kCommitted : value == 2 ? Outcome::kAbandoned : Outcome::kPending;
  }
  void CloseDeclarations() override { store_.Add(kClosedKey, 1); }
  bool DeclarationsClosed() override { return store_.Add(kClosedKey, 0) > 0; }
  void StartDrain() override { store_.Add(kDrainingKey, 1); }
  bool LeaderDraining() override { return store_.Add(kDrainingKey, 0) > 0; }

  // The record first, then the state's one atomic step: a decision that sealed the cycle
  // before it made the state start sealed; one after it finds the record when it reads 1.
  bool BeginCommit(uint64_t declaration, int64_t cycle, const storage::CommitRecord& record) override {
    store_.Set(rendezvous::CommitProposalKey(declaration), nlohmann::json{{"cycle", cycle}, {"record", record.ToText()}}.dump());
    return store_.Add(rendezvous::CommitStateKey(declaration, cycle), 1) == 1;
  }

  bool PredecessorHandedOver() override {
    if (handed_over_) return true;
    const std::optional<std::string> text = store_.Peek({rendezvous::kHandedOverKey}).front();
    const std::optional<int64_t> cycle = text ? rendezvous::HandedOverCycle(*text) : int64_t{0};
    if (!cycle) throw std::runtime_error(std::string("the store's ") + rendezvous::kHandedOverKey + " is not a cycle: " + *text);
    handed_over_ = incarnation_ == 0 || *cycle >= incarnation_;
    return handed_over_;
  }

  bool CommitStillBegun(uint64_t declaration, int64_t cycle) override {
    return store_.Add(rendezvous::CommitStateKey(declaration, cycle), 0) == 1;
  }

  // `latest` first: a decision reading the state as written reads the record it names.
  void CommitWritten(uint64_t declaration, const storage::CommitRecord& record, bool moved_latest) override {
    if (moved_latest) {
      store_.Set(rendezvous::kCommitLatestKey,
                 nlohmann::json{{"declaration", declaration}, {"record", record.ToText()}}.dump());
    }
    store_.Add(rendezvous::CommitStateKey(declaration, record.cycle), 1);
  }

  std::vector<int> AbsentRanks() override {
    const std::optional<std::string> text = store_.Peek({rendezvous::kAbsentRanksKey}).front();
    std::vector<int> ranks;
    if (!text) return ranks;
    const nlohmann::json value = nlohmann::json::parse(*text, nullptr, false);
    if (!value.is_array()) throw std::runtime_error(std::string("the store's ") + rendezvous::kAbsentRanksKey + " is not a list of ranks");
    for (const auto& rank : value) {
      if (rank.is_number_integer()) ranks.push_back(rank.get<int>());
    }
    return ranks;
  }

 private:
  // The rank's launchers in the order they joined; one launcher joins a rank at a time.
  void RegisterReplacement() {
    const std::string key = LaunchersKey(node_rank_);
    nlohmann::json joined = nlohmann::json::array();
    if (auto text = store_.Peek({key}).front()) joined = ParseLaunchers(*text, key);
    joined.push_back(incarnation_);
    store_.Set(key, joined.dump());
  }

  void ReadReplacements() {
    std::vector<std::string> keys;
    for (int rank = 0; rank < node_count_; ++rank) keys.push_back(LaunchersKey(rank));
    const auto values = store_.Peek(keys);
    for (int rank = 0; rank < node_count_; ++rank) {
      if (!values[size_t(rank)]) continue;
      for (const auto& joined : ParseLaunchers(*values[size_t(rank)], keys[size_t(rank)])) {
        rule_.Replace(rank, joined.get<int64_t>());
      }
    }
  }

  // The answers the rule has not counted yet, of the launcher running each rank now: the
  // rule takes no other's (a replaced launcher's word is stale).
  void ReadAnswers(uint64_t declaration) {
    std::vector<std::pair<int, int64_t>> asked;
    std::vector<std::string> keys;
    for (int rank : rule_.Missing(declaration)) {
      asked.emplace_back(rank, rule_.Incarnation(rank));
      keys.push_back(AnswerKey(declaration, rank, rule_.Incarnation(rank)));
    }
    if (keys.empty()) return;
    const auto values = store_.Peek(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!values[i]) continue;
      checkpoint::PartAnswer answer = ParseAnswer(*values[i], keys[i]);
      answer.rank = asked[i].first;
      answer.incarnation = asked[i].second;
      answer.declaration = declaration;
      rule_.Answer(answer);
    }
  }

  static nlohmann::json ParseLaunchers(const std::string& text, const std::string& key) {
    nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
    if (!value.is_array()) throw std::runtime_error("the store's " + key + " is not a list of cycles");
    for (const auto& joined : value) {
      if (!joined.is_number_integer()) throw std::runtime_error("the store's " + key + " is not a list of cycles");
    }
    return value;
  }

  static checkpoint::PartAnswer ParseAnswer(const std::string& text, const std::string& key) {
    try {
      const auto value = nlohmann::json::parse(text);
      checkpoint::PartAnswer answer;
      answer.kind = ParseKind(value.at("kind").get<std::string>(), key);
      answer.cycle = value.at("cycle").get<int64_t>();
      answer.version = value.value("version", "");
      return answer;
    } catch (const nlohmann::json::exception& error) {
      throw std::runtime_error("the store's " + key + " is not a checkpoint answer: " + error.what());
    }
  }

  static Declaration ParseDeclaration(uint64_t number, const std::string& text, const std::string& key) {
    try {
      const auto value = nlohmann::json::parse(text);
      Declaration declaration{number, storage::BytesFromJson(value.at("name")), value.at("save").get<std::string>(),
                              value.value("cycle", int64_t(0)), {}};
      if (value.contains("resumed_age_ns")) declaration.resumed_age_ns = value["resumed_age_ns"].get<int64_t>();
      return declaration;
    } catch (const std::exception& error) {
      throw std::runtime_error("the store's " + key + " is not a checkpoint declaration: " + error.what());
    }
  }

  rendezvous::Store& store_;
  int node_count_;
  int node_rank_;
  int64_t incarnation_;
  checkpoint::CommitRule rule_;  // node 0's: fed what it declared and what it read
  bool handed_over_ = false;     // PredecessorHandedOver, once true
};

}  // namespace

std::unique_ptr<CommitBoard> MakeStoreCommitBoard(rendezvous::Store& store, int node_count, int node_rank,
                                                  int64_t incarnation) {
  return std::make_unique<StoreCommitBoard>(store, node_count, node_rank, incarnation);
}

}  // namespace bt::launcher
