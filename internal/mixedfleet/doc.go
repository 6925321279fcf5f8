// Package mixedfleet holds the end-to-end tests of a mixed fleet: the
// `coordinator lock` command in the redisson lock layout
// (COORDINATOR_LOCK_LAYOUT=redisson) and Java processes using Redisson's
// RLock on the same names, on a real redis-server and on the test Redis
// Cluster, for each Redisson version scripts/services builds
// (docs/lock.md, "Mixed fleets with Redisson"). It has no code of its own.
package mixedfleet
