#include <dlfcn.h>

#include <cstdlib>

#include <spdlog/spdlog.h>

#include "launcher/exit_codes.h"
#include "launcher/plugin.h"
#include "launcher/supervision/peers.h"
#include "rendezvous/mpi_exchange.h"

namespace bt::launcher {
namespace {

using ExchangeFunction = decltype(&bt_mpi_exchange);

ExchangeFunction LoadExchange() {
  const std::string path = PluginPath("BT_MPI_PLUGIN", "libbt_mpi_exchange.so");
  void* plugin = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (plugin == nullptr) {
    throw LaunchFailure(kExitUnavailable, "launcher.rendezvous.backend is \"mpi\" but the MPI plugin cannot be loaded: " +
                                              std::string(dlerror()) + " (build with Open MPI, or use \"tcp\")");
  }
  auto exchange = reinterpret_cast<ExchangeFunction>(dlsym(plugin, "bt_mpi_exchange"));
  if (exchange == nullptr) throw LaunchFailure(kExitInternal, path + ": no bt_mpi_exchange symbol");
  return exchange;  // the plugin stays loaded: Open MPI keeps state until the process exits
}

}  // namespace

std::unique_ptr<MpiPeers> MpiPeers::Join(const env::NodeIdentity& identity) {
  if (!identity.under_mpi) {
    throw LaunchFailure(kExitConfig, "launcher.rendezvous.backend is \"mpi\" but this process was not started by mpirun");
  }
  ExchangeFunction exchange = LoadExchange();
  const std::string mine = rendezvous::LocalNodeInfo(identity.rank).ToJson().dump();
  char* roster_json = nullptr;
  char* error = nullptr;
  int status = exchange(identity.rank, identity.count, mine.c_str(), &roster_json, &error);
  std::string roster_text = roster_json != nullptr ? roster_json : "";
  std::string error_text = error != nullptr ? error : "";
  std::free(roster_json);
  std::free(error);
  if (status != 0) throw LaunchFailure(kExitUnavailable, "MPI rendezvous failed: " + error_text);
  auto peers = std::make_unique<MpiPeers>();
  peers->roster_ = rendezvous::RosterFromJson({{"nodes", nlohmann::json::parse(roster_text)}});
  spdlog::info("all {} nodes joined (MPI)", identity.count);
  return peers;
}

}  // namespace bt::launcher
