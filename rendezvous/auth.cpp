#include "rendezvous/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <stdexcept>

namespace bt::rendezvous {

std::string RandomNonce() {
  std::string nonce(kNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), int(nonce.size())) != 1) {
    throw std::runtime_error("RAND_bytes failed: no entropy for the rendezvous nonce");
  }
  return nonce;
}

std::string ProveToken(const std::string& token, const std::string& nonce, const std::string& role) {
  const std::string message = "bt-launch-rendezvous-v1/" + role + "/" + nonce;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_length = 0;
  if (HMAC(EVP_sha256(), token.data(), int(token.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), mac, &mac_length) == nullptr) {
    throw std::runtime_error("HMAC-SHA256 failed");
  }
  return std::string(reinterpret_cast<char*>(mac), mac_length);
}

bool VerifyProof(const std::string& token, const std::string& nonce, const std::string& role, const std::string& proof) {
  const std::string expected = ProveToken(token, nonce, role);
  return proof.size() == expected.size() && CRYPTO_memcmp(proof.data(), expected.data(), expected.size()) == 0;
}

std::string DeriveTokenFromJobId(const std::string& job_id) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  const std::string input = "bt-launch-derived-token-v1/" + job_id;
  if (EVP_Digest(input.data(), input.size(), digest, &length, EVP_sha256(), nullptr) != 1) {
    throw std::runtime_error("SHA-256 failed");
  }
  return std::string(reinterpret_cast<char*>(digest), length);
}

}  // namespace bt::rendezvous
