// ProbeTlsHandshake: one TLS handshake with a server, made with OpenSSL and
// the same files a gRPC channel would use, to tell a permanent TLS failure
// from a server that is down. gRPC reports both as UNAVAILABLE ("tcp
// handshaker shutdown", "Socket closed"), so a client would retry an
// unknown CA or a refused client certificate until its deadline; with the
// probe it stops at once and says which side refused what.
//
// Stateless and thread-safe; blocks for at most `timeout`.
#ifndef CO2_COMMON_TLS_PROBE_H_
#define CO2_COMMON_TLS_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/tls_config.h"

namespace co2::common {

// OK: the handshake with `address` (host:port) succeeded and the server did
// not refuse this client's certificate. UNAUTHENTICATED naming the reason
// and the file to look at: the server's certificate failed verification
// against tls.ca_file (unknown CA, a name that does not match `host`,
// expired), or the server refused this client's certificate or its absence
// (a TLS alert). UNAVAILABLE: no TCP connection, no answer within `timeout`,
// or the server is not speaking TLS; retrying may help. INVALID_ARGUMENT for
// unreadable client certificate or key files.
absl::Status ProbeTlsHandshake(const std::string& address,
                               const TlsOptions& tls, absl::Duration timeout);

}  // namespace co2::common

#endif  // CO2_COMMON_TLS_PROBE_H_
