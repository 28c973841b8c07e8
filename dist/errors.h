// The errors a collective (or the rendezvous before it) raises. All are tessera::Error, so a caller that
// does not care which one catches one type; tests and launchers that do care
// (a timeout is not a desync) tell them apart.
#pragma once

#include "tensor/error.h"

namespace tessera::dist {

// A blocking wait ran past the group's timeout. The message names the
// collective, its sequence number and the ranks that never arrived.
class CollectiveTimeout : public Error {
 public:
  using Error::Error;
};

// Another rank of the job failed (threw, or aborted); pending and later
// collectives fail fast with this, naming the dead rank and its error.
class RankFailed : public Error {
 public:
  using Error::Error;
};

// Ranks issued different collectives at the same sequence number (debug mode,
// or a size mismatch any backend can see); the message shows both signatures.
class CollectiveMismatch : public Error {
 public:
  using Error::Error;
};

// A rendezvous store's operation or connect (dist/launch/tcp_store.h) ran past its
// timeout; the message names the key, the server and what never came.
class StoreTimeout : public Error {
 public:
  using Error::Error;
};

}  // namespace tessera::dist
