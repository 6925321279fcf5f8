package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"
)

// injectNet carries out one network fault: toxics on the links of one host
// to one dependency (or all of its dependencies), held for f.Hold, then
// removed.
func (r *run) injectNet(ctx context.Context, i int, f FaultSpec, rec *FaultRecord) (target, detail string) {
	host, who, period, incID := r.pickHost(ctx, f)
	if host == "" {
		return "", "no process to hit"
	}
	var deps []string
	switch f.Kind {
	case FaultPartitionAll:
		deps = r.net.deps(host)
	default:
		deps = []string{f.Dep}
	}
	var links []*netLink
	var names []string
	for _, d := range deps {
		for _, l := range r.net.hostLinks(host, d) {
			links = append(links, l)
			names = append(names, l.name)
		}
	}
	if len(links) == 0 {
		return "", fmt.Sprintf("%s has no link to %s", host, strings.Join(deps, ", "))
	}
	rec.Host, rec.Deps = host, deps
	if period != "" {
		rec.Replica, rec.Period = incID, period
	}
	if iw := r.inprocByHost(host); iw != nil {
		if s, ok := iw.current(); ok {
			rec.Holder = s.Holder
			who = strings.TrimPrefix(who+fmt.Sprintf(", holding %s with fence %d as %s", s.Key, s.Fence, s.Holder), ", ")
		}
	}
	ts, what, reset := netToxics(f)
	target = host
	if who != "" {
		target += " (" + who + ")"
	}
	start := time.Now()
	if err := r.net.apply(links, ts); err != nil {
		_ = r.net.heal(links, true)
		return target, "could not apply: " + err.Error()
	}
	detail = fmt.Sprintf("%s on its links to %s (%s) for %s", what, strings.Join(deps, ", "), strings.Join(names, ", "), f.Hold.Round(10*time.Millisecond))
	if f.Retrigger && period != "" {
		// A takeover: once the cut-off owner's lease has run out, another
		// replica is asked to run its period; the fences must keep the
		// cut-off owner's batches out.
		pause(ctx, replicaWatchdogTTL+500*time.Millisecond)
		id := fmt.Sprintf("chaos-%d-net-takeover-%d", r.cfg.Seed, i)
		r.trigger(ctx, "http", period, id, f.Target, "takeover while "+host+" is cut off", r.currentID(host))
		detail += "; billrun:" + period + " triggered on another replica after its lease ran out"
	}
	pause(ctx, f.Hold-time.Since(start))
	if err := r.net.heal(links, reset); err != nil {
		detail += "; heal: " + err.Error()
	} else if reset {
		detail += "; healed, its connections reset"
	} else {
		detail += "; healed"
	}
	return target, detail
}

// netToxics are the toxics of a network fault, what they do in words, and
// whether the connections are reset when it heals (data was dropped).
func netToxics(f FaultSpec) ([]toxic, string, bool) {
	both := func(t toxic) []toxic {
		up, down := t, t
		up.stream, down.stream = "upstream", "downstream"
		return []toxic{up, down}
	}
	switch f.Kind {
	case FaultPartitionRedis, FaultPartitionPostgres, FaultPartitionKafka, FaultPartitionAll:
		// Every byte dropped both ways, connections held open (new ones
		// too): as packets lost on a partitioned network, not refused.
		return both(toxic{typ: "timeout", attrs: map[string]any{"timeout": 0}}), "partition (every byte dropped both ways)", true
	case FaultLatency:
		// Half each way: requests arrive late too (a write sent before a
		// lease ended may commit after it), and a round trip takes Latency
		// +/- Jitter longer.
		return both(toxic{typ: "latency", attrs: map[string]any{"latency": f.Latency.Milliseconds() / 2, "jitter": f.Jitter.Milliseconds() / 2}}),
			fmt.Sprintf("latency: round trips %s +/- %s longer (half each way)", f.Latency, f.Jitter), false
	case FaultBandwidth:
		return both(toxic{typ: "bandwidth", attrs: map[string]any{"rate": f.RateKB}}), fmt.Sprintf("bandwidth limited to %d KB/s both ways", f.RateKB), false
	case FaultResetPeer:
		return both(toxic{typ: "reset_peer", attrs: map[string]any{"timeout": f.Timeout.Milliseconds()}}),
			fmt.Sprintf("reset_peer (every connection reset %s after data flows)", f.Timeout), true
	case FaultTimeout:
		return []toxic{{typ: "timeout", stream: f.Stream, attrs: map[string]any{"timeout": f.Timeout.Milliseconds()}}},
			fmt.Sprintf("half-open links (the %s stream dropped, connections closed after %s)", f.Stream, f.Timeout), true
	case FaultSlicer:
		return both(toxic{typ: "slicer", attrs: map[string]any{"average_size": f.SliceBytes, "size_variation": f.SliceBytes / 2, "delay": 200}}),
			fmt.Sprintf("slicer (data cut into segments of about %d bytes, 200 µs apart)", f.SliceBytes), false
	}
	return nil, "unknown network fault", false
}

// pickHost chooses the host a network fault hits and describes it: a
// replica slot (with PreferOwner, one whose replica owns a running bill
// run, whose period it returns) or, with OnWorker, a lock worker
// (preferably one holding a lease). Kafka links exist on replicas only,
// PostgreSQL links on replicas and in-process workers.
func (r *run) pickHost(ctx context.Context, f FaultSpec) (host, who, period, incID string) {
	if f.OnWorker {
		var hosts, holding []string
		for w := 0; w < r.cfg.LockWorkers; w++ {
			if f.Dep == depRedis || f.Dep == "" {
				hosts = append(hosts, lockHost(w))
				if r.lockWorkerHolding(w) {
					holding = append(holding, lockHost(w))
				}
			}
		}
		for _, iw := range r.inproc {
			hosts = append(hosts, iw.host)
			if _, ok := iw.current(); ok {
				holding = append(holding, iw.host)
			}
		}
		if f.Dep != "" {
			hosts = slices.DeleteFunc(hosts, func(h string) bool { return !slices.Contains(r.net.deps(h), f.Dep) })
			holding = slices.DeleteFunc(holding, func(h string) bool { return !slices.Contains(r.net.deps(h), f.Dep) })
		}
		if f.PreferOwner && len(holding) > 0 {
			// Half the time an in-process holder if there is one: the
			// fenced store shows what became of it (cutOffs).
			if f.Target%2 == 0 {
				for _, h := range holding {
					if r.inprocByHost(h) != nil {
						return h, "", "", ""
					}
				}
			}
			return holding[f.Target%len(holding)], "", "", ""
		}
		if len(hosts) > 0 {
			return hosts[f.Target%len(hosts)], "", "", ""
		}
	}
	if len(r.slots) == 0 {
		return "", "", "", ""
	}
	inc, why, p := r.pickReplica(ctx, f)
	if inc == nil {
		s := r.slots[f.Target%len(r.slots)]
		return replicaHost(s.idx), "no replica running in the slot", "", ""
	}
	s := r.slotOf(inc)
	if s == nil {
		return "", "", "", ""
	}
	return replicaHost(s.idx), fmt.Sprintf("%s, pid %d%s", inc.id, inc.proc.pid(), why), p, inc.id
}

// currentID is the replica id of a replica host's current incarnation ("").
func (r *run) currentID(host string) string {
	for _, s := range r.slots {
		if replicaHost(s.idx) == host {
			s.mu.Lock()
			defer s.mu.Unlock()
			if s.cur != nil {
				return s.cur.id
			}
		}
	}
	return ""
}

// lockWorkerHolding: a `coordinator lock` of worker w holds its lock now.
func (r *run) lockWorkerHolding(w int) bool {
	for _, l := range r.runningLocks() {
		if l.rec.Worker == w {
			return true
		}
	}
	return false
}
