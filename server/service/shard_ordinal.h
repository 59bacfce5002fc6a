// The shard index of a co2-aggregator that runs as pod N of a Kubernetes
// StatefulSet (hostname "<statefulset>-N"), so that every replica of one pod
// template serves a different shard. Pure functions; any thread.
#ifndef CO2_SERVER_SERVICE_SHARD_ORDINAL_H_
#define CO2_SERVER_SERVICE_SHARD_ORDINAL_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace co2::server {

// N from "name-N" (the digits after the last '-'; a domain suffix, as in
// "co2-aggregator-1.co2-aggregator.ns.svc", is ignored). INVALID_ARGUMENT
// naming the hostname when it does not end in -N.
absl::StatusOr<int> OrdinalFromHostname(absl::string_view hostname);

// `flag_value` unless `from_hostname`, else OrdinalFromHostname of this
// machine's hostname.
absl::StatusOr<int> ResolveShardIndex(int flag_value, bool from_hostname);

}  // namespace co2::server

#endif  // CO2_SERVER_SERVICE_SHARD_ORDINAL_H_
