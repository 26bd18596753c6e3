// The C interface of the MPI node-info exchange, a plugin (libbt_mpi_exchange.so) that the
// launcher loads with dlopen only when launcher.rendezvous.backend is "mpi": libmpi is
// large, and every other launch should not pay for loading it.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// Initialises MPI, checks that this process is `expected_rank` of `expected_count`, gathers
// every rank's `my_info_json` on rank 0, checks them there, broadcasts the verdict with
// the roster, and finalises MPI. Returns 0 and sets *roster_json (a JSON array in rank
// order) or returns non-zero and sets *error. Both are malloc'd; free() them.
int bt_mpi_exchange(int expected_rank, int expected_count, const char* my_info_json, char** roster_json,
                    char** error);

#ifdef __cplusplus
}
#endif
