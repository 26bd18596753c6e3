// What each node tells the leader when it joins, and what the leader learns on its own
// (the address it sees the node connect from, when it joined).
#pragma once

#include <sys/socket.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace bt::rendezvous {

struct NodeInfo {
  int rank = -1;
  std::string host;                    // gethostname()
  std::vector<std::string> addresses;  // the node's own non-loopback addresses
  int pid = 0;
  std::string seen_from;               // peer address as the leader sees it
  double joined_after_s = 0;           // since the leader started serving

  nlohmann::json ToJson() const;
  static NodeInfo FromJson(const nlohmann::json& json);  // throws FrameError on bad input
  std::string Label() const;           // "node 2 (gpu-7, 10.0.0.7)"
};

// An IPv4 or IPv6 socket address as text, IPv4-mapped IPv6 shown as plain IPv4; "" for
// other families.
std::string AddressText(const sockaddr* address);

// gethostname(), "" when it fails.
std::string HostName();

// This host's name and non-loopback interface addresses.
NodeInfo LocalNodeInfo(int rank);

// "0, 2-5, 9": rank lists stay short even when thousands are missing.
std::string FormatRanks(const std::vector<int>& ranks);

// The roster as a table (rank, host, address, joined after, and a fabric summary per rank
// when given) or one JSON object.
std::string FormatRosterTable(const std::vector<NodeInfo>& roster, const std::map<int, std::string>& fabric = {});
nlohmann::json RosterToJson(const std::vector<NodeInfo>& roster);
std::vector<NodeInfo> RosterFromJson(const nlohmann::json& json);

}  // namespace bt::rendezvous
