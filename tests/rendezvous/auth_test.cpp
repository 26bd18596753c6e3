#include "rendezvous/auth.h"

#include <gtest/gtest.h>

namespace bt::rendezvous {
namespace {

TEST(Auth, ProofVerifiesOnlyWithTheSameTokenNonceAndRole) {
  const std::string nonce = RandomNonce();
  const std::string proof = ProveToken("secret-token", nonce, "client");
  EXPECT_EQ(proof.size(), 32u);
  EXPECT_TRUE(VerifyProof("secret-token", nonce, "client", proof));
  EXPECT_FALSE(VerifyProof("other-token", nonce, "client", proof));
  EXPECT_FALSE(VerifyProof("secret-token", RandomNonce(), "client", proof));
  EXPECT_FALSE(VerifyProof("secret-token", nonce, "server", proof)) << "a client proof must not pass as the server's";
  EXPECT_FALSE(VerifyProof("secret-token", nonce, "client", proof.substr(1)));
}

TEST(Auth, NoncesAreFresh) {
  EXPECT_EQ(RandomNonce().size(), kNonceBytes);
  EXPECT_NE(RandomNonce(), RandomNonce());
}

TEST(Auth, DerivedTokensDependOnTheJobId) {
  EXPECT_EQ(DeriveTokenFromJobId("job-a"), DeriveTokenFromJobId("job-a"));
  EXPECT_NE(DeriveTokenFromJobId("job-a"), DeriveTokenFromJobId("job-b"));
}

}  // namespace
}  // namespace bt::rendezvous
