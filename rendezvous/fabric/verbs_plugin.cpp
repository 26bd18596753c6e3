// Written linearly, as rdma-core's libibverbs/examples/rc_pingpong.c is: one step per
// verbs call, every return code checked and named in the error.
#include "rendezvous/fabric/verbs_plugin.h"

#include <infiniband/verbs.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

namespace {

constexpr size_t kBufferBytes = 4096;

struct Remote {
  unsigned lid = 0, qpn = 0, psn = 0, rkey = 0;
  unsigned long long addr = 0;
  int mtu = 0;
  ibv_gid gid{};
};

int Fail(char** error, const std::string& what, int code) {
  *error = strdup((what + ": " + strerror(code) + " (errno " + std::to_string(code) + ")").c_str());
  return -1;
}

int FailText(char** error, const std::string& what) {
  *error = strdup(what.c_str());
  return -1;
}

int MtuBytes(ibv_mtu mtu) { return 128 << int(mtu); }  // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5

double NowMicros() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return double(now.tv_sec) * 1e6 + double(now.tv_nsec) / 1e3;
}

ibv_context* OpenDevice(const char* name, char** error) {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  if (list == nullptr) {
    Fail(error, "ibv_get_device_list", errno);
    return nullptr;
  }
  ibv_context* context = nullptr;
  for (int i = 0; i < count; ++i) {
    if (strcmp(ibv_get_device_name(list[i]), name) != 0) continue;
    context = ibv_open_device(list[i]);
    if (context == nullptr) Fail(error, std::string("ibv_open_device(") + name + ")", errno);
    break;
  }
  if (context == nullptr && *error == nullptr) {
    FailText(error, std::string(name) + ": not in ibv_get_device_list (is /dev/infiniband/uverbs* in the container?)");
  }
  ibv_free_device_list(list);
  return context;
}

std::string GidHex(const ibv_gid& gid) {
  char text[33];
  for (int i = 0; i < 16; ++i) snprintf(text + 2 * i, 3, "%02x", gid.raw[i]);
  return text;
}

bool ParseGid(const char* hex, ibv_gid& gid) {
  if (strlen(hex) != 32) return false;
  for (int i = 0; i < 16; ++i) {
    unsigned byte = 0;
    if (sscanf(hex + 2 * i, "%2x", &byte) != 1) return false;
    gid.raw[i] = uint8_t(byte);
  }
  return true;
}

}  // namespace

struct bt_verbs_endpoint {
  ibv_context* context = nullptr;
  ibv_pd* pd = nullptr;
  ibv_mr* mr = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  volatile uint64_t* buffer = nullptr;  // the peer writes here
  uint64_t* send_value = nullptr;       // what we write to the peer (same MR, second word)
  int port = 0;
  int gid_index = 0;
  ibv_port_attr port_attr{};
  unsigned psn = 0;
  Remote remote;
};

extern "C" int bt_verbs_active_mtu(const char* device, int port, int* mtu_bytes, char** error) {
  *error = nullptr;
  ibv_context* context = OpenDevice(device, error);
  if (context == nullptr) return -1;
  ibv_port_attr attr{};
  const int rc = ibv_query_port(context, uint8_t(port), &attr);
  ibv_close_device(context);
  if (rc != 0) return Fail(error, std::string("ibv_query_port(") + device + ":" + std::to_string(port) + ")", rc);
  *mtu_bytes = MtuBytes(attr.active_mtu);
  return 0;
}

extern "C" int bt_verbs_open(const char* device, int port, int gid_index, bt_verbs_endpoint** out, char** local_info,
                             char** error) {
  *error = nullptr;
  auto* e = new bt_verbs_endpoint;
  *out = e;
  e->port = port;
  e->gid_index = gid_index < 0 ? 0 : gid_index;
  // 1. The device.
  e->context = OpenDevice(device, error);
  if (e->context == nullptr) return -1;
  // 2. The port: ACTIVE, with a LID on InfiniBand.
  int rc = ibv_query_port(e->context, uint8_t(port), &e->port_attr);
  if (rc != 0) return Fail(error, "ibv_query_port", rc);
  if (e->port_attr.state != IBV_PORT_ACTIVE) return FailText(error, "port is not ACTIVE (ibv_query_port)");
  if (e->port_attr.link_layer == IBV_LINK_LAYER_INFINIBAND && e->port_attr.lid == 0) {
    return FailText(error, "port has no LID (no subnet manager?)");
  }
  // 3. The GID this side is addressed by.
  ibv_gid gid{};
  rc = ibv_query_gid(e->context, uint8_t(port), e->gid_index, &gid);
  if (rc != 0) return Fail(error, "ibv_query_gid(index " + std::to_string(e->gid_index) + ")", rc);
  // 4. Protection domain.
  e->pd = ibv_alloc_pd(e->context);
  if (e->pd == nullptr) return Fail(error, "ibv_alloc_pd", errno);
  // 5. A page-aligned buffer the peer may write into.
  void* memory = nullptr;
  rc = posix_memalign(&memory, size_t(sysconf(_SC_PAGESIZE)), kBufferBytes);
  if (rc != 0) return Fail(error, "posix_memalign", rc);
  memset(memory, 0, kBufferBytes);
  e->buffer = static_cast<volatile uint64_t*>(memory);
  e->send_value = static_cast<uint64_t*>(memory) + 1;
  e->mr = ibv_reg_mr(e->pd, memory, kBufferBytes, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (e->mr == nullptr) return Fail(error, "ibv_reg_mr (RLIMIT_MEMLOCK, IPC_LOCK?)", errno);
  // 6. Completion queue.
  e->cq = ibv_create_cq(e->context, 16, nullptr, nullptr, 0);
  if (e->cq == nullptr) return Fail(error, "ibv_create_cq", errno);
  // 7. RC queue pair.
  ibv_qp_init_attr init{};
  init.send_cq = e->cq;
  init.recv_cq = e->cq;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 4;
  init.cap.max_recv_wr = 1;
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  e->qp = ibv_create_qp(e->pd, &init);
  if (e->qp == nullptr) return Fail(error, "ibv_create_qp", errno);
  // 8. RESET -> INIT.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = uint8_t(port);
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  rc = ibv_modify_qp(e->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
  if (rc != 0) return Fail(error, "ibv_modify_qp(INIT)", rc);
  // 9. What the peer needs.
  srand48(long(getpid()) * long(time(nullptr)) + port);
  e->psn = unsigned(lrand48() & 0xffffff);
  char info[160];
  snprintf(info, sizeof info, "%04x:%06x:%06x:%08x:%016llx:%d:%s", e->port_attr.lid, e->qp->qp_num, e->psn, e->mr->rkey,
           static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(memory)), int(e->port_attr.active_mtu),
           GidHex(gid).c_str());
  *local_info = strdup(info);
  return 0;
}

extern "C" int bt_verbs_connect(bt_verbs_endpoint* e, const char* remote_info, char** error) {
  *error = nullptr;
  Remote& r = e->remote;
  char gid_hex[40] = {};
  if (sscanf(remote_info, "%x:%x:%x:%x:%llx:%d:%39s", &r.lid, &r.qpn, &r.psn, &r.rkey, &r.addr, &r.mtu, gid_hex) != 7 ||
      !ParseGid(gid_hex, r.gid)) {
    return FailText(error, std::string("malformed connection data from the peer: \"") + remote_info + "\"");
  }
  // 10. INIT -> RTR: path MTU is the smaller of both sides'.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = ibv_mtu(std::min(int(e->port_attr.active_mtu), r.mtu));
  attr.dest_qp_num = r.qpn;
  attr.rq_psn = r.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;
  attr.ah_attr.dlid = uint16_t(r.lid);
  attr.ah_attr.sl = 0;
  attr.ah_attr.src_path_bits = 0;
  attr.ah_attr.port_num = uint8_t(e->port);
  // RoCE has no LIDs: the GRH is mandatory. InfiniBand within one subnet routes by LID.
  if (e->port_attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    attr.ah_attr.is_global = 1;
    attr.ah_attr.grh.dgid = r.gid;
    attr.ah_attr.grh.sgid_index = uint8_t(e->gid_index);
    attr.ah_attr.grh.hop_limit = 64;
  }
  int rc = ibv_modify_qp(e->qp, &attr,
                         IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  if (rc != 0) return Fail(error, "ibv_modify_qp(RTR) (wrong GID index or MTU?)", rc);
  // 11. RTR -> RTS: timeout 14 (~67 ms x 7 retries): a dead path fails in about half a second.
  attr = {};
  attr.qp_state = IBV_QPS_RTS;
  attr.timeout = 14;
  attr.retry_cnt = 7;
  attr.rnr_retry = 7;
  attr.sq_psn = e->psn;
  attr.max_rd_atomic = 1;
  rc = ibv_modify_qp(e->qp, &attr,
                     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC);
  if (rc != 0) return Fail(error, "ibv_modify_qp(RTS)", rc);
  return 0;
}

namespace {

// 12. One signalled RDMA write of `value` into the peer's first word; 13. its completion.
int WriteAndComplete(bt_verbs_endpoint* e, uint64_t value, double deadline_us, char** error) {
  *e->send_value = value;
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(e->send_value);
  sge.length = sizeof(uint64_t);
  sge.lkey = e->mr->lkey;
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = e->remote.addr;
  wr.wr.rdma.rkey = e->remote.rkey;
  ibv_send_wr* bad = nullptr;
  int rc = ibv_post_send(e->qp, &wr, &bad);
  if (rc != 0) return Fail(error, "ibv_post_send(RDMA_WRITE)", rc);
  ibv_wc wc{};
  for (;;) {
    rc = ibv_poll_cq(e->cq, 1, &wc);
    if (rc < 0) return FailText(error, "ibv_poll_cq failed");
    if (rc == 1) break;
    if (NowMicros() > deadline_us) return FailText(error, "no completion of the RDMA write before the deadline (ibv_poll_cq)");
  }
  if (wc.status != IBV_WC_SUCCESS) {
    return FailText(error, std::string("RDMA write completed with ") + ibv_wc_status_str(wc.status) + " (status " +
                               std::to_string(int(wc.status)) + ", ibv_poll_cq)");
  }
  return 0;
}

int AwaitValue(bt_verbs_endpoint* e, uint64_t value, double deadline_us, char** error) {
  while (*e->buffer != value) {
    if (NowMicros() > deadline_us) {
      return FailText(error, "the peer's RDMA write " + std::to_string(value) + " never arrived before the deadline");
    }
  }
  return 0;
}

}  // namespace

extern "C" int bt_verbs_pingpong(bt_verbs_endpoint* e, int initiator, int iterations, int timeout_ms,
                                 double* round_trip_us, char** error) {
  *error = nullptr;
  const double deadline = NowMicros() + timeout_ms * 1000.0;
  std::vector<double> trips;
  for (uint64_t i = 1; i <= uint64_t(iterations); ++i) {
    const double start = NowMicros();
    if (initiator) {
      if (WriteAndComplete(e, i, deadline, error) != 0 || AwaitValue(e, i, deadline, error) != 0) return -1;
    } else {
      if (AwaitValue(e, i, deadline, error) != 0 || WriteAndComplete(e, i, deadline, error) != 0) return -1;
    }
    trips.push_back(NowMicros() - start);
  }
  std::sort(trips.begin(), trips.end());
  *round_trip_us = trips.empty() ? 0 : trips[trips.size() / 2];
  return 0;
}

// 14. Tear down in reverse.
extern "C" void bt_verbs_close(bt_verbs_endpoint* e) {
  if (e == nullptr) return;
  if (e->qp != nullptr) ibv_destroy_qp(e->qp);
  if (e->cq != nullptr) ibv_destroy_cq(e->cq);
  if (e->mr != nullptr) ibv_dereg_mr(e->mr);
  if (e->pd != nullptr) ibv_dealloc_pd(e->pd);
  if (e->context != nullptr) ibv_close_device(e->context);
  free(const_cast<uint64_t*>(e->buffer));
  delete e;
}
