// Proof that a peer holds the job token: HMAC-SHA256 over a fresh nonce from the other
// side, so a captured handshake cannot be replayed and the token never crosses the wire.
#pragma once

#include <string>

namespace bt::rendezvous {

inline constexpr size_t kNonceBytes = 32;

std::string RandomNonce();  // kNonceBytes from the OpenSSL CSPRNG

// role: "client" or "server", so a client's proof can never be reflected back as the
// server's (or the reverse).
std::string ProveToken(const std::string& token, const std::string& nonce, const std::string& role);
bool VerifyProof(const std::string& token, const std::string& nonce, const std::string& role, const std::string& proof);

// The token when BT_RENDEZVOUS_TOKEN is absent: derived from the job id. Anyone who knows
// the job id can join, so it only guards against mistakes (another job's nodes on the
// same port), not against an attacker.
std::string DeriveTokenFromJobId(const std::string& job_id);

}  // namespace bt::rendezvous
