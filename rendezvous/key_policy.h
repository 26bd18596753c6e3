// What the leader's store accepts from a connection (docs/PROTOCOL.md, "Keys and values"):
// the size of keys and values, and who may write the keys of the launcher's own
// namespace (bt/). The launcher trusts those keys (the roster, the ready barrier, the
// fabric plan), so a connection that holds the token but never joined, or a node writing
// another node's key, must not be able to forge them.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace bt::rendezvous {

// Keys are names, never data: the longest the launcher writes is a checkpoint's part key
// (a directory name of at most 255 bytes plus the prefix).
inline constexpr size_t kMaxKeyBytes = 1024;
// A value the leader stores. The launcher's own are a few KiB at most (a node's fabric
// inventory, about 6 KiB for 8 rails; the plan node 0 shares, the same size at any node
// count); the bound leaves the job's own keys room for a serialized object of some MiB.
inline constexpr size_t kMaxValueBytes = 16u << 20;
// What one connection's parked get/wait requests may hold on the leader (their keys and
// bookkeeping, about 2 x key + 170 bytes each): some 3,700 waits on full-length keys, while
// short keys meet the count bound first (4,096, server.cpp); a connection that parks more is
// closed.
inline constexpr size_t kMaxParkedBytesPerConnection = 8u << 20;

// One mget (Store::Peek) names at most this many keys, and its answer holds at most this
// many bytes of values (more is answered with an error, the connection kept).
inline constexpr size_t kMaxPeekKeys = 1024;
inline constexpr size_t kMaxPeekReplyBytes = 16u << 20;

// The launcher's own keys start with this; anything else is the job's to use freely.
inline constexpr std::string_view kLauncherKeyPrefix = "bt/";

enum class KeyWrite { kSet, kAdd, kRead };

// Why a connection whose node joined as `rank` (-1: not joined) may not write `key` this
// way, or nullopt when it may. kRead is an add of 0 (a counter read): any joined node may
// read any counter except the ones the leader's server writes itself.
// `training_rank`: the training rank the node runs, where it differs from its node rank (a
// hot spare's: -1 until it takes one); the checkpoint keys are that rank's.
std::optional<std::string> WriteRefusal(std::string_view key, KeyWrite write, int rank,
                                        std::optional<int> training_rank = std::nullopt);

// Why `key` (or `value`) cannot be stored, or nullopt when it can.
std::optional<std::string> KeySizeRefusal(std::string_view key);
std::optional<std::string> ValueSizeRefusal(std::string_view key, size_t value_bytes);

}  // namespace bt::rendezvous
