#include "rendezvous/fabric/gid.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <stdexcept>

namespace bt::rendezvous::fabric {
namespace {

struct GidEntry {
  in6_addr address{};
  int roce_version = -1;  // 1, 2, or -1 when the type could not be read
};

GidEntry EntryAt(const Port& port, int index) {
  GidEntry entry;
  const Gid* gid = port.FindGid(index);
  if (gid == nullptr) return entry;  // an empty slot: the all-zero GID
  inet_pton(AF_INET6, gid->value.c_str(), &entry.address);
  if (gid->type.rfind("IB/RoCE v1", 0) == 0 || gid->type.rfind("RoCE v1", 0) == 0) entry.roce_version = 1;
  if (gid->type.rfind("RoCE v2", 0) == 0) entry.roce_version = 2;
  return entry;
}

int Family(const in6_addr& address) { return IN6_IS_ADDR_V4MAPPED(&address) ? AF_INET : AF_INET6; }

// Not all-zero and not link-local (fe80::/64): NCCL's validGid.
bool Valid(const in6_addr& address) {
  return !IN6_IS_ADDR_UNSPECIFIED(&address) && !IN6_IS_ADDR_LINKLOCAL(&address);
}

bool InRange(const in6_addr& address, int family, const std::string& range) {
  if (range.empty()) return true;
  const size_t slash = range.find('/');
  const int bits = std::stoi(range.substr(slash + 1));
  unsigned char prefix[16] = {};
  inet_pton(family, range.substr(0, slash).c_str(), prefix);
  const unsigned char* bytes = address.s6_addr + (family == AF_INET ? 12 : 0);
  for (int bit = 0; bit < bits; ++bit) {
    const unsigned char mask = 0x80 >> (bit % 8);
    if ((bytes[bit / 8] & mask) != (prefix[bit / 8] & mask)) return false;
  }
  return true;
}

}  // namespace

GidPreferences GidPreferences::FromLookup(const std::optional<std::string>& family,
                                          const std::optional<std::string>& version,
                                          const std::optional<std::string>& range) {
  GidPreferences preferences;
  if (family) {
    if (*family == "AF_INET6") preferences.family = AF_INET6;
    else if (*family != "AF_INET") throw std::invalid_argument("NCCL_IB_ADDR_FAMILY: expected AF_INET or AF_INET6, got \"" + *family + "\"");
  }
  if (version) {
    if (*version != "1" && *version != "2") throw std::invalid_argument("NCCL_IB_ROCE_VERSION_NUM: expected 1 or 2, got \"" + *version + "\"");
    preferences.roce_version = std::stoi(*version);
  }
  if (range) {
    const size_t slash = range->find('/');
    unsigned char bytes[16];
    const int width = preferences.family == AF_INET ? 32 : 128;
    bool ok = slash != std::string::npos && slash + 1 < range->size() &&
              range->find_first_not_of("0123456789", slash + 1) == std::string::npos &&
              inet_pton(preferences.family, range->substr(0, slash).c_str(), bytes) == 1 &&
              range->size() - slash - 1 <= 3 && std::stoi(range->substr(slash + 1)) <= width;  // 3 digits: no overflow
    if (!ok) throw std::invalid_argument("NCCL_IB_ADDR_RANGE: expected an address/prefix of the wanted family, got \"" + *range + "\"");
    preferences.range = *range;
  }
  return preferences;
}

bool IsZeroGid(const std::string& gid) { return gid.find_first_not_of("0:") == std::string::npos; }

// Start at index 0; a later entry replaces the choice when it brings the wanted address
// family, or when it has that family, is valid and in range, and has the wanted RoCE
// version while the current choice does not (or is invalid).
int SelectGidIndex(const Port& port, const GidPreferences& preferences) {
  int chosen = 0;
  for (int candidate = 1; candidate < port.gid_table_length; ++candidate) {
    const GidEntry current = EntryAt(port, chosen);
    const GidEntry next = EntryAt(port, candidate);
    const int next_family = Family(next.address);
    const bool in_range = InRange(next.address, preferences.family, preferences.range);
    if (next_family != Family(current.address) && next_family == preferences.family && in_range) {
      chosen = candidate;
      continue;
    }
    if (next_family != preferences.family || !Valid(next.address) || !in_range) continue;
    if ((current.roce_version != next.roce_version || !Valid(current.address)) &&
        next.roce_version == preferences.roce_version) {
      chosen = candidate;
    }
  }
  return chosen;
}

const Gid* FindUsableGid(const Port& port, const GidPreferences& preferences) {
  const int index = SelectGidIndex(port, preferences);
  const GidEntry entry = EntryAt(port, index);
  if (!Valid(entry.address) || Family(entry.address) != preferences.family ||
      !InRange(entry.address, preferences.family, preferences.range) || entry.roce_version != preferences.roce_version) {
    return nullptr;
  }
  return port.FindGid(index);
}

std::string GidPreferences::Describe() const {
  return "RoCE v" + std::to_string(roce_version) + (family == AF_INET ? " IPv4" : " IPv6") +
         (range.empty() ? "" : " in " + range);
}

}  // namespace bt::rendezvous::fabric
