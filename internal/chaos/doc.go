// Package chaos is the coordinator's fault-injection verifier, in the
// manner of Jepsen: it runs the real product as separate processes against
// real Redis, PostgreSQL and Kafka, injects faults drawn from a seed,
// records a history and checks properties over it. `make chaos` runs it
// (cmd/chaos); docs/chaos.md is the user's guide, RELIABILITY.md the record
// of what it found.
//
// # What runs
//
// Everything on free loopback ports, owned by the verifier (children with
// Pdeathsig, each in its own process group, stopped by PID): a redis-server
// master and replica without persistence and a Sentinel (the product uses
// sentinel mode, so failover is real); a throwaway PostgreSQL cluster
// (initdb, then the postgres binary as a child, as the postgres OS user when
// root) with track_commit_timestamp on; a single-node KRaft Kafka broker
// from the jars scripts/services fetches, with a listener per replica slot;
// and an embedded Toxiproxy (netproxy.go) giving every process proxies of
// its own to each dependency. The shared test services are never touched.
// (services_redis.go, services_postgres.go, services_kafka.go; binaries.go
// finds the programs; setup.go sets a run up, phases.go runs its phases.)
//
// The workload: Config.Replicas `coordinator serve` processes (each restart
// is a new incarnation, r2-3 = slot 2, third start), bill-run triggers for
// a new closed period every 1.5-3.5 s, one to three per period from Kafka
// and HTTP, and repeats of old periods; a bill-run cron schedule ticking
// every 10 s; the MSISDN reaper every 5 s over expired
// reservations the verifier keeps adding; Config.InprocWorkers
// redislock.Locker workers inside the verifier writing to a fenced store
// (inproc.go); and Config.LockWorkers loops of
// `coordinator lock --key K -- chaos critical`, whose helper records its
// critical section (CLOCK_MONOTONIC start and end, shared by every process
// on the host) and appends fenced rows (COORDINATOR_LOCK_FENCE) to the
// verifier's tables; now and then it leaves a child running behind it, or
// overruns its lease while ignoring SIGTERM.
//
// # Faults
//
// Plan derives the schedule from the seed alone (kinds, times, lengths,
// target indices): replica SIGKILL and SIGSTOP past the watchdog TTL (the
// owner of a running bill run when there is one, then a takeover trigger to
// another replica), SIGKILL and SIGSTOP of a `coordinator lock` process,
// Redis master restart (empty), Sentinel failover, DEBUG SLEEP past the
// client's read timeout (optionally followed by takeovers of every RUNNING
// run), PostgreSQL restart (fast or immediate, held down a while), Kafka
// restart (SIGTERM or SIGKILL), PostgreSQL losing acknowledged commits
// (asynchronous commit, then an immediate shutdown), and poison and ~1 MB
// triggers, each followed by a valid trigger on the same partition.
// PlanNet derives a second schedule that runs beside it: network faults on
// one process's proxies to one dependency (partitions from Redis, from
// PostgreSQL, from Kafka, from everything; latency, a bandwidth limit,
// reset_peer, half-open links, slicing). Timing is not
// deterministic, nor is which process a fault hits at run time: a replay
// repeats the schedule, not the interleaving.
//
// # Checks
//
// Check runs pure checkers over a History (checks.go; bill runs and their
// events in checks_billrun.go, the lock holders' history in checks_lock.go;
// each has a violating and a clean synthetic history in checks_test.go,
// checks_cron_test.go or checks_fenced_test.go): exact invoices per
// (subscriber, period); every accepted trigger's period COMPLETED within
// the recovery bound, with no further trigger; no bill-run batch committed
// under a fence below one already in effect (a later claim, seen through a
// trigger-fed change log of bill_runs, or a batch); no fenced row below the
// highest already committed for its key; fences strictly increasing per
// key; no two lock holders inside their sections at once; nothing of a
// holder's process tree alive or writing after its `coordinator lock`
// exited; events agreeing with Postgres (one run.completed id per COMPLETED
// period, every ownership.acquired ended by released, lost or a crash);
// poison dead-lettered; the reaper freeing what expired and nothing else;
// replicas neither crashing nor hanging on shutdown; every bill-run cron
// tick run or recorded by some replica (checks_cron.go); the fenced store
// never accepting two holders' writes interleaved, and in-process fences
// increasing (checks_fenced.go).
//
// # The sabotage pass
//
// CHAOS_SABOTAGE=1 runs the same against the coordinator built with
// -tags chaos_sabotage (internal/billrun/sabotage_chaos.go: a bill run
// ignores a lost lease, its batches skip the claim-fence check and it
// completes without reconciling; internal/trigger/sabotage_chaos.go: a
// failed cron tick is dropped, not retried). The verifier refuses a binary whose build does not
// match the mode (CheckBuild), and TestSabotagePassReportsAnomalies proves
// the stale commits, the missing invoices and the dropped tick of that
// build are reported.
package chaos
