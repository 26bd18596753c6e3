#include "rendezvous/node_info.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstdio>

#include "rendezvous/wire.h"

namespace bt::rendezvous {

nlohmann::json NodeInfo::ToJson() const {
  return {{"rank", rank}, {"host", host}, {"addresses", addresses}, {"pid", pid},
          {"seen_from", seen_from}, {"joined_after_s", joined_after_s}};
}

NodeInfo NodeInfo::FromJson(const nlohmann::json& json) {
  if (!json.is_object()) throw FrameError("node info: expected a map");
  NodeInfo info;
  info.rank = int(IntField(json, "rank"));
  info.host = StringField(json, "host");
  info.pid = int(IntField(json, "pid"));
  auto addresses = json.find("addresses");
  if (addresses != json.end() && addresses->is_array()) {
    for (const auto& address : *addresses) {
      if (address.is_string()) info.addresses.push_back(address.get<std::string>());
    }
  }
  if (auto seen = json.find("seen_from"); seen != json.end() && seen->is_string()) info.seen_from = seen->get<std::string>();
  if (auto after = json.find("joined_after_s"); after != json.end() && after->is_number()) {
    info.joined_after_s = after->get<double>();
  }
  return info;
}

std::string NodeInfo::Label() const {
  std::string where = seen_from.empty() ? (addresses.empty() ? "" : addresses.front()) : seen_from;
  return "node " + std::to_string(rank) + " (" + host + (where.empty() ? "" : ", " + where) + ")";
}

std::string AddressText(const sockaddr* address) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, text, sizeof text);
    return text;
  }
  if (address->sa_family != AF_INET6) return "";
  const auto* v6 = reinterpret_cast<const sockaddr_in6*>(address);
  inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof text);
  if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) return std::string(text).substr(7);  // "::ffff:10.0.0.2"
  return text;
}

std::string HostName() {
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

NodeInfo LocalNodeInfo(int rank) {
  NodeInfo info;
  info.rank = rank;
  info.pid = int(getpid());
  info.host = HostName();
  ifaddrs* interfaces = nullptr;
  if (getifaddrs(&interfaces) != 0) return info;
  for (ifaddrs* entry = interfaces; entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || (entry->ifa_flags & IFF_LOOPBACK) || !(entry->ifa_flags & IFF_UP)) continue;
    if (entry->ifa_addr->sa_family == AF_INET6 &&
        IN6_IS_ADDR_LINKLOCAL(&reinterpret_cast<sockaddr_in6*>(entry->ifa_addr)->sin6_addr)) {
      continue;
    }
    const std::string text = AddressText(entry->ifa_addr);
    if (!text.empty()) info.addresses.push_back(std::string(entry->ifa_name) + "=" + text);
  }
  freeifaddrs(interfaces);
  return info;
}

std::string FormatRanks(const std::vector<int>& ranks) {
  std::string text;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    text += (text.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) text += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return text;
}

std::string FormatRosterTable(const std::vector<NodeInfo>& roster, const std::map<int, std::string>& fabric) {
  std::string table = "rank  host                          address                                  joined after";
  table += fabric.empty() ? "\n" : "  fabric\n";
  for (const NodeInfo& node : roster) {
    char line[256];
    std::snprintf(line, sizeof line, "%-5d %-29s %-40s %7.3f s", node.rank, node.host.c_str(), node.seen_from.c_str(),
                  node.joined_after_s);
    table += line;
    if (auto it = fabric.find(node.rank); it != fabric.end()) table += "    " + it->second;
    table += "\n";
  }
  return table;
}

nlohmann::json RosterToJson(const std::vector<NodeInfo>& roster) {
  nlohmann::json nodes = nlohmann::json::array();
  for (const NodeInfo& node : roster) nodes.push_back(node.ToJson());
  return {{"node_count", roster.size()}, {"nodes", nodes}};
}

std::vector<NodeInfo> RosterFromJson(const nlohmann::json& json) {
  std::vector<NodeInfo> roster;
  if (!json.is_object() || !json.contains("nodes") || !json["nodes"].is_array()) throw FrameError("roster: bad shape");
  for (const auto& node : json["nodes"]) roster.push_back(NodeInfo::FromJson(node));
  return roster;
}

}  // namespace bt::rendezvous
