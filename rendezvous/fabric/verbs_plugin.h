// The libibverbs part of the fabric check, built as a plugin (libbt_verbs.so) and loaded
// only when a probe runs or a port's active MTU is wanted: the launcher itself starts in
// images without rdma-core. C ABI; every error is a malloc'd string naming the verbs call
// and its errno, to be freed by the caller.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// The active MTU of device:port in bytes (ibv_query_port), which sysfs does not show.
int bt_verbs_active_mtu(const char* device, int port, int* mtu_bytes, char** error);

// One RC queue pair on device:port with a small registered buffer, in the INIT state.
// `local_info` (malloc'd) is what the peer needs, as "LID:QPN:PSN:RKEY:VADDR:MTU:GID" in hex.
// `gid_index` < 0: GID 0 (InfiniBand); RoCE passes its RoCE v2 IPv4 index.
typedef struct bt_verbs_endpoint bt_verbs_endpoint;
int bt_verbs_open(const char* device, int port, int gid_index, bt_verbs_endpoint** endpoint, char** local_info,
                  char** error);

// INIT -> RTR -> RTS toward the peer that published `remote_info`.
int bt_verbs_connect(bt_verbs_endpoint* endpoint, const char* remote_info, char** error);

// RDMA-write ping-pong: the initiator writes sequence number i into the peer's buffer and
// waits for it to come back; the responder waits for i and writes it back. Returns the
// median round trip in microseconds; fails when `timeout_ms` passes or a completion fails.
int bt_verbs_pingpong(bt_verbs_endpoint* endpoint, int initiator, int iterations, int timeout_ms,
                      double* round_trip_us, char** error);

void bt_verbs_close(bt_verbs_endpoint* endpoint);

#ifdef __cplusplus
}
#endif
