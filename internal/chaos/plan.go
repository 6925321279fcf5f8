package chaos

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Fault kinds, as counted in report.json's "faults".
const (
	FaultKillReplica     = "kill-replica"      // SIGKILL a serve replica (preferably one owning a running bill run), restart it later
	FaultPauseReplica    = "pause-replica"     // SIGSTOP a replica (preferably a bill-run owner) past its watchdog TTL, then SIGCONT
	FaultKillLockHolder  = "kill-lock-holder"  // SIGKILL a `coordinator lock` process while its command runs
	FaultPauseLockHolder = "pause-lock-holder" // SIGSTOP a `coordinator lock` process past its lease, then SIGCONT
	FaultRedisRestart    = "redis-restart"     // SIGKILL the Redis master and start it again at once, empty (no persistence)
	FaultRedisFailover   = "redis-failover"    // SIGKILL the master, Sentinel promotes the replica, the old master returns empty as a replica
	FaultRedisStall      = "redis-stall"       // DEBUG SLEEP on the master, past the client's read timeout
	FaultPGRestart       = "postgres-restart"  // stop PostgreSQL (fast or immediate), keep it down a while, start it
	FaultKafkaRestart    = "kafka-restart"     // stop the broker (SIGTERM or SIGKILL), keep it down a while, start it
	FaultPoisonTrigger   = "poison-trigger"    // malformed bill-run triggers, each followed by a valid one on the same partition
	FaultOversized       = "oversized-trigger" // a ~1 MB trigger (over the consumer's limit) followed by a valid one on the same partition
	// FaultPGLostCommits makes PostgreSQL lose commits it acknowledged:
	// synchronous_commit off and a long wal_writer_delay for a while, then
	// an immediate shutdown (the WAL it had not written yet is gone).
	FaultPGLostCommits = "postgres-lost-commits"
)

// Network fault kinds (netfaults.go): each hits one process's links
// (through its own proxies) to one dependency, or to all of them.
const (
	FaultPartitionRedis    = "partition-redis"    // cut one process off from Redis (sentinel and both nodes)
	FaultPartitionPostgres = "partition-postgres" // cut one replica off from PostgreSQL
	FaultPartitionKafka    = "partition-kafka"    // cut one replica off from Kafka
	FaultPartitionAll      = "partition-all"      // cut one process off from every dependency
	FaultLatency           = "latency"            // 200-2000 ms of latency with jitter on one link
	FaultBandwidth         = "bandwidth"          // a bandwidth limit (KB/s) on one link
	FaultResetPeer         = "reset-peer"         // connections on one link reset (TCP RST) as soon as data flows
	FaultTimeout           = "timeout"            // a half-open link: requests reach the server, no answer comes back, the connection closes after a timeout
	FaultSlicer            = "slicer"             // data on one link sliced into tiny TCP segments with small delays
)

// ProcessFaults are the kinds of the main schedule (one fault at a time).
var ProcessFaults = []string{
	FaultKillReplica, FaultPauseReplica, FaultKillLockHolder, FaultPauseLockHolder,
	FaultRedisRestart, FaultRedisFailover, FaultRedisStall,
	FaultPGRestart, FaultKafkaRestart, FaultPoisonTrigger, FaultOversized,
	FaultPGLostCommits,
}

// NetFaults are the kinds of the network schedule, which runs beside the
// main one (one network fault at a time).
var NetFaults = []string{
	FaultPartitionRedis, FaultPartitionPostgres, FaultPartitionKafka, FaultPartitionAll,
	FaultLatency, FaultBandwidth, FaultResetPeer, FaultTimeout, FaultSlicer,
}

// AllFaults lists every kind in a fixed order.
var AllFaults = append(slices.Clone(ProcessFaults), NetFaults...)

func isNetFault(kind string) bool { return slices.Contains(NetFaults, kind) }

// FaultSpec is one planned fault. Everything in it comes from the seed; what
// it hits at run time (which replica owns a run at that moment) does not.
type FaultSpec struct {
	// At is the planned start, from the start of the fault phase. A fault
	// that overruns its estimate pushes the next one back.
	At   time.Duration `json:"at"`
	Kind string        `json:"kind"`
	// Target picks among the candidates at run time (index modulo their number).
	Target int `json:"target"`
	// PreferOwner: target the replica that owns a running bill run, if any.
	PreferOwner bool `json:"prefer_owner,omitempty"`
	// Hold is how long the fault lasts: pause length, time a server stays
	// down, DEBUG SLEEP length, delay before a killed replica restarts.
	Hold time.Duration `json:"hold"`
	// Hard: SIGKILL / immediate shutdown instead of the graceful stop.
	Hard bool `json:"hard,omitempty"`
	// Retrigger: a takeover. During a replica pause, once the paused
	// owner's lease has run out, its period is sent to another replica;
	// after a Redis fault, every RUNNING period is sent to a replica other
	// than its owner (as a retrying client or a redelivery would).
	Retrigger bool `json:"retrigger,omitempty"`
	// Count of poison records.
	Count int `json:"count,omitempty"`
	// Down: how long a server stays down after a crash (lost commits).
	Down time.Duration `json:"down,omitempty"`
	// AlignTick: start just before the next bill-run cron tick (sabotage
	// mode's PostgreSQL restart, so that a tick meets the outage).
	AlignTick bool `json:"align_tick,omitempty"`

	// Network faults. OnWorker: the fault hits a lock worker (a `coordinator
	// lock` worker or an in-process Locker worker), not a replica. Dep is
	// the dependency a toxic acts on (redis, postgres, kafka); partitions
	// imply theirs. Stream: downstream (server to client), upstream or
	// both. Then the toxic's parameters.
	OnWorker   bool          `json:"on_worker,omitempty"`
	Dep        string        `json:"dep,omitempty"`
	Stream     string        `json:"stream,omitempty"`
	Latency    time.Duration `json:"latency,omitempty"`
	Jitter     time.Duration `json:"jitter,omitempty"`
	RateKB     int           `json:"rate_kb,omitempty"`
	Timeout    time.Duration `json:"timeout,omitempty"`
	SliceBytes int           `json:"slice_bytes,omitempty"`
}

func (f FaultSpec) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%5.1fs %-18s target=%d hold=%s", f.At.Seconds(), f.Kind, f.Target, f.Hold.Round(10*time.Millisecond))
	if f.PreferOwner {
		b.WriteString(" prefer_owner")
	}
	if f.Hard {
		b.WriteString(" hard")
	}
	if f.Retrigger {
		b.WriteString(" retrigger")
	}
	if f.AlignTick {
		b.WriteString(" align_tick")
	}
	if f.Count > 0 {
		fmt.Fprintf(&b, " count=%d", f.Count)
	}
	if f.Down > 0 {
		fmt.Fprintf(&b, " down=%s", f.Down.Round(10*time.Millisecond))
	}
	if f.OnWorker {
		b.WriteString(" on_worker")
	}
	if f.Dep != "" {
		fmt.Fprintf(&b, " dep=%s", f.Dep)
	}
	if f.Stream != "" {
		fmt.Fprintf(&b, " stream=%s", f.Stream)
	}
	if f.Latency > 0 {
		fmt.Fprintf(&b, " latency=%s jitter=%s", f.Latency, f.Jitter)
	}
	if f.RateKB > 0 {
		fmt.Fprintf(&b, " rate=%dKB/s", f.RateKB)
	}
	if f.Timeout > 0 {
		fmt.Fprintf(&b, " timeout=%s", f.Timeout)
	}
	if f.SliceBytes > 0 {
		fmt.Fprintf(&b, " slice=%dB", f.SliceBytes)
	}
	return b.String()
}

// Timing the plan assumes (the product settings the verifier runs with).
const (
	replicaWatchdogTTL = 4 * time.Second // COORDINATOR_LOCK_WATCHDOG_TIMEOUT of the replicas
	lockWatchdogTTL    = 3 * time.Second // ... of the lock workers
	redisReadTimeout   = 2 * time.Second // redislock's default client read timeout
	warmup             = 4 * time.Second // workload only, before the first fault
	tailQuiet          = 3 * time.Second // no fault starts this close to the end of the phase
)

// estimate is how long a fault is expected to take (its hold plus the
// recovery the executor waits for), used to space the plan.
func estimate(f FaultSpec) time.Duration {
	switch f.Kind {
	case FaultKillReplica, FaultKillLockHolder, FaultPoisonTrigger, FaultOversized:
		return time.Second
	case FaultRedisRestart:
		return 2 * time.Second
	case FaultRedisFailover:
		return 12 * time.Second
	case FaultKafkaRestart:
		return f.Hold + 15*time.Second
	case FaultPGRestart:
		if f.AlignTick {
			return f.Hold + cronEvery + 3*time.Second
		}
		return f.Hold + 3*time.Second
	case FaultPGLostCommits:
		return time.Duration(max(f.Count, 1)) * (f.Hold + f.Down + 4*time.Second)
	default:
		return f.Hold
	}
}

// Plan derives the fault schedule for a phase of length d from seed. The
// first round has every enabled kind once, in an order drawn from the seed
// (as far as the phase has room); after that kinds are drawn at random.
// In sabotage mode the faults the sabotaged build mishandles (a replica
// paused past its lease, a Redis restart that loses its lock, PostgreSQL
// losing acknowledged commits, a PostgreSQL outage across a cron tick) come
// first, are drawn three times as often, and are always followed by a
// takeover; a PostgreSQL restart then starts just before a cron tick and
// keeps the server down past the claim's retries.
func Plan(seed uint64, d time.Duration, kinds []string, sabotage bool) []FaultSpec {
	rng := rand.New(rand.NewPCG(seed, 0xfa017))
	if len(kinds) == 0 {
		kinds = AllFaults
	}
	kinds = slices.DeleteFunc(slices.Clone(kinds), isNetFault)
	if len(kinds) == 0 {
		return nil
	}
	round := slices.Clone(kinds)
	rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
	// Moved to the front in turn: the last comes first.
	favoured := []string{FaultPGRestart, FaultPGLostCommits, FaultRedisRestart, FaultPauseReplica}
	weighted := slices.Clone(kinds)
	if sabotage {
		for _, k := range favoured {
			if i := slices.Index(round, k); i > 0 {
				round = append([]string{k}, slices.Delete(round, i, i+1)...)
			}
			if slices.Contains(kinds, k) {
				weighted = append(weighted, k, k)
			}
		}
	}
	var out []FaultSpec
	t := warmup
	for i := 0; ; i++ {
		var kind string
		if i < len(round) {
			kind = round[i]
		} else {
			kind = weighted[rng.IntN(len(weighted))]
		}
		f := specFor(rng, kind)
		if sabotage && slices.Contains(favoured, kind) {
			f.Retrigger = true
			switch kind {
			case FaultPGRestart:
				f.AlignTick = true
				f.Hold = between(rng, 6*time.Second, 8*time.Second)
			case FaultPGLostCommits:
				// Each crash loses about a page of WAL, not always a batch:
				// three in a row.
				f.Count = 3
				f.Hold = between(rng, 2*time.Second, 4*time.Second)
			}
		}
		f.At = t
		if t+estimate(f) > d-tailQuiet {
			if i < len(round) {
				continue // a shorter kind of the first round may still fit
			}
			break
		}
		out = append(out, f)
		t += estimate(f) + between(rng, 2*time.Second, 5*time.Second)
	}
	return out
}

func between(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
}

func specFor(rng *rand.Rand, kind string) FaultSpec {
	f := FaultSpec{Kind: kind, Target: rng.IntN(1 << 16)}
	switch kind {
	case FaultKillReplica:
		f.PreferOwner = rng.IntN(10) < 7
		f.Hold = between(rng, time.Second, 4*time.Second) // down before the restart
	case FaultPauseReplica:
		f.PreferOwner = rng.IntN(10) < 8
		f.Retrigger = rng.IntN(4) < 3
		f.Hold = replicaWatchdogTTL + between(rng, time.Second, 5*time.Second)
	case FaultKillLockHolder:
	case FaultPauseLockHolder:
		f.Hold = lockWatchdogTTL + between(rng, 500*time.Millisecond, 2500*time.Millisecond)
	case FaultRedisRestart, FaultRedisFailover:
		f.Retrigger = rng.IntN(10) < 6
	case FaultRedisStall:
		f.Retrigger = rng.IntN(10) < 6
		f.Hold = redisReadTimeout + between(rng, 500*time.Millisecond, 1800*time.Millisecond)
	case FaultPGRestart:
		f.Hard = rng.IntN(2) == 0
		f.Hold = between(rng, 0, 6*time.Second)
	case FaultKafkaRestart:
		f.Hard = rng.IntN(2) == 0
		f.Hold = between(rng, 0, 5*time.Second)
	case FaultPoisonTrigger:
		f.Count = 1 + rng.IntN(3)
	case FaultOversized:
		f.Count = 1
	case FaultPGLostCommits:
		// Commits acknowledged during Hold may be lost; a short Down keeps
		// the runs going across the crash (their batch retries outlast it).
		f.Hold = between(rng, 2*time.Second, 8*time.Second)
		f.Down = between(rng, 0, 1500*time.Millisecond)
	}
	return f
}

// PlanNet derives the network schedule, which runs beside the main one,
// from seed: the enabled network kinds in a seeded order first, then drawn
// at random, one at a time with 1-4 s between them.
func PlanNet(seed uint64, d time.Duration, kinds []string) []FaultSpec {
	rng := rand.New(rand.NewPCG(seed, 0x7e7))
	if len(kinds) == 0 {
		kinds = AllFaults
	}
	kinds = slices.DeleteFunc(slices.Clone(kinds), func(k string) bool { return !isNetFault(k) })
	if len(kinds) == 0 {
		return nil
	}
	round := slices.Clone(kinds)
	rng.Shuffle(len(round), func(i, j int) { round[i], round[j] = round[j], round[i] })
	var out []FaultSpec
	t := warmup + time.Second
	for i := 0; ; i++ {
		var kind string
		if i < len(round) {
			kind = round[i]
		} else {
			kind = kinds[rng.IntN(len(kinds))]
		}
		f := netSpecFor(rng, kind)
		f.At = t
		if t+f.Hold > d-tailQuiet {
			if i < len(round) {
				continue
			}
			break
		}
		out = append(out, f)
		t += f.Hold + between(rng, time.Second, 4*time.Second)
	}
	return out
}

func netSpecFor(rng *rand.Rand, kind string) FaultSpec {
	f := FaultSpec{Kind: kind, Target: rng.IntN(1 << 16)}
	deps := []string{depRedis, depPostgres, depKafka}
	switch kind {
	case FaultPartitionRedis, FaultPartitionAll:
		// Longer than the lease: the cut-off holder's lease runs out and
		// another takes over (the fences must keep it out).
		f.OnWorker = rng.IntN(10) < 4
		f.PreferOwner = rng.IntN(10) < 7
		f.Retrigger = true
		f.Hold = replicaWatchdogTTL + between(rng, time.Second, 6*time.Second)
		f.Dep = depRedis
		if kind == FaultPartitionAll {
			f.Dep = ""
		}
	case FaultPartitionPostgres:
		f.PreferOwner = rng.IntN(10) < 7
		f.Hold = between(rng, 3*time.Second, 10*time.Second)
		f.Dep = depPostgres
	case FaultPartitionKafka:
		f.Hold = between(rng, 4*time.Second, 14*time.Second)
		f.Dep = depKafka
	case FaultLatency:
		f.Dep = deps[rng.IntN(len(deps))]
		f.OnWorker = f.Dep != depKafka && rng.IntN(10) < 4
		f.Hold = between(rng, 5*time.Second, 15*time.Second)
		f.Latency = between(rng, 200*time.Millisecond, 2000*time.Millisecond).Round(time.Millisecond)
		f.Jitter = between(rng, f.Latency/10, f.Latency/2).Round(time.Millisecond)
		f.Stream = "both"
	case FaultBandwidth:
		f.Dep = deps[rng.IntN(len(deps))]
		f.OnWorker = f.Dep != depKafka && rng.IntN(10) < 4
		f.Hold = between(rng, 5*time.Second, 15*time.Second)
		f.RateKB = 1 + rng.IntN(32)
		f.Stream = "both"
	case FaultResetPeer:
		f.Dep = deps[rng.IntN(len(deps))]
		f.OnWorker = f.Dep != depKafka && rng.IntN(10) < 4
		f.Hold = between(rng, 2*time.Second, 6*time.Second)
		f.Timeout = between(rng, 0, 500*time.Millisecond).Round(time.Millisecond)
		f.Stream = "both"
	case FaultTimeout:
		f.Dep = deps[rng.IntN(len(deps))]
		f.OnWorker = f.Dep != depKafka && rng.IntN(10) < 4
		f.Hold = between(rng, 3*time.Second, 10*time.Second)
		f.Timeout = between(rng, 500*time.Millisecond, 3*time.Second).Round(time.Millisecond)
		f.Stream = "downstream"
	case FaultSlicer:
		f.Dep = deps[rng.IntN(len(deps))]
		f.OnWorker = f.Dep != depKafka && rng.IntN(10) < 4
		f.Hold = between(rng, 5*time.Second, 15*time.Second)
		f.SliceBytes = 1 + rng.IntN(64)
		f.Stream = "both"
	}
	return f
}

// ParseFaultKinds reads a comma-separated list of kinds ("" = all).
func ParseFaultKinds(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return slices.Clone(AllFaults), nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(AllFaults, k) {
			return nil, fmt.Errorf("unknown fault kind %q (known: %s)", k, strings.Join(AllFaults, ", "))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}
