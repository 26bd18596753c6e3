#include "rendezvous/mpi_exchange.h"

#include <mpi.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

char* Duplicate(const std::string& text) {
  char* copy = static_cast<char*>(std::malloc(text.size() + 1));
  std::memcpy(copy, text.c_str(), text.size() + 1);
  return copy;
}

int Fail(char** error, const std::string& message) {
  *error = Duplicate(message);
  return 1;
}

std::string MpiError(const char* call, int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(call) + " failed: " + std::string(text, size_t(length));
}

// Rank 0 collects every info (O(nodes) bytes), checks the counts, and sends back one
// verdict: the roster on success, the reason on failure.
int Exchange(int rank, int size, int expected_rank, int expected_count, const std::string& mine, std::string& verdict) {
  const std::string claim = std::to_string(expected_rank) + "/" + std::to_string(expected_count) + "\t" + mine;
  int length = int(claim.size());
  std::vector<int> lengths(rank == 0 ? size_t(size) : 0), offsets(rank == 0 ? size_t(size) : 0);
  if (int code = MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD); code != MPI_SUCCESS) {
    verdict = MpiError("MPI_Gather", code);
    return 1;
  }
  std::string gathered;
  if (rank == 0) {
    size_t total = 0;
    for (int i = 0; i < size; ++i) {
      offsets[size_t(i)] = int(total);
      total += size_t(lengths[size_t(i)]);
    }
    gathered.resize(total);
  }
  if (int code = MPI_Gatherv(claim.data(), length, MPI_CHAR, gathered.data(), lengths.data(), offsets.data(), MPI_CHAR,
                             0, MPI_COMM_WORLD);
      code != MPI_SUCCESS) {
    verdict = MpiError("MPI_Gatherv", code);
    return 1;
  }
  int status = 0;
  if (rank == 0) {
    std::string roster = "[", problems;
    for (int i = 0; i < size; ++i) {
      std::string entry = gathered.substr(size_t(offsets[size_t(i)]), size_t(lengths[size_t(i)]));
      auto tab = entry.find('\t');
      const std::string expected = std::to_string(i) + "/" + std::to_string(size);
      if (entry.substr(0, tab) != expected) {
        problems += (problems.empty() ? "" : "; ") + std::string("MPI rank ") + std::to_string(i) +
                    " believes it is node " + entry.substr(0, tab) + " (expected " + expected + ")";
      }
      roster += (i ? "," : "") + entry.substr(tab + 1);
    }
    roster += "]";
    status = problems.empty() ? 0 : 1;
    verdict = problems.empty() ? roster : problems;
  }
  int verdict_length = int(verdict.size());
  int header[2] = {status, verdict_length};
  MPI_Bcast(header, 2, MPI_INT, 0, MPI_COMM_WORLD);
  verdict.resize(size_t(header[1]));
  MPI_Bcast(verdict.data(), header[1], MPI_CHAR, 0, MPI_COMM_WORLD);
  return header[0];
}

}  // namespace

extern "C" int bt_mpi_exchange(int expected_rank, int expected_count, const char* my_info_json, char** roster_json,
                               char** error) {
  *roster_json = nullptr;
  *error = nullptr;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    if (int code = MPI_Init(nullptr, nullptr); code != MPI_SUCCESS) return Fail(error, MpiError("MPI_Init", code));
  }
  int rank = -1, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != expected_count) {
    // Every rank sees the same size, so every rank fails the same way without a collective.
    MPI_Finalize();
    return Fail(error, "MPI world has " + std::to_string(size) + " ranks but the job has " +
                           std::to_string(expected_count) + " nodes (mpirun -np must equal compute.node_count)");
  }
  std::string verdict;
  int status = Exchange(rank, size, expected_rank, expected_count, my_info_json, verdict);
  MPI_Finalize();
  if (status != 0) return Fail(error, verdict);
  *roster_json = Duplicate(verdict);
  return 0;
}
