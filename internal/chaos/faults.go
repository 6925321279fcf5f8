package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kgo"
)

// runFaults injects the planned faults one after another until the phase
// ends. A fault that has begun is carried to its end (a paused process is
// continued, a stopped server started again) even if the phase ends
// meanwhile; root cancels everything.
func (r *run) runFaults(phase context.Context, plan []FaultSpec) {
	root := context.WithoutCancel(phase)
	for i, f := range plan {
		if !pause(phase, time.Duration(r.hist.StartNS+f.At.Nanoseconds()-Mono())) {
			return
		}
		rec := FaultRecord{Spec: f, StartNS: Mono()}
		if isNetFault(f.Kind) {
			rec.Target, rec.Detail = r.injectNet(root, i, f, &rec)
		} else {
			rec.Target, rec.Detail = r.inject(root, i, f, &rec)
		}
		rec.Skipped = rec.Target == ""
		rec.EndNS = Mono()
		r.mu.Lock()
		r.hist.Faults = append(r.hist.Faults, rec)
		r.mu.Unlock()
		msg := f.Kind
		if rec.Target != "" {
			msg += " on " + rec.Target
		}
		if rec.Detail != "" {
			msg += ": " + rec.Detail
		}
		stream := "fault"
		if isNetFault(f.Kind) {
			stream = "network fault"
		}
		r.logf("%s %d/%d at %s: %s (took %s)", stream, i+1, len(plan), r.hist.rel(rec.StartNS), msg, time.Duration(rec.EndNS-rec.StartNS).Round(10*time.Millisecond))
	}
}

// inject carries out one fault and says what it hit.
func (r *run) inject(ctx context.Context, i int, f FaultSpec, rec *FaultRecord) (target, detail string) {
	switch f.Kind {
	case FaultRedisRestart, FaultRedisFailover, FaultRedisStall:
		// The takeover goes out as soon as the master answers again, while
		// the runs that lost their lock may still be going.
		var took string
		after := func() {
			if f.Retrigger {
				took = "; " + r.takeover(ctx, i, f)
			}
		}
		target, detail = r.injectRedis(ctx, f, after)
		return target, detail + took
	}
	switch f.Kind {
	case FaultKillReplica:
		inc, why, _ := r.pickReplica(ctx, f)
		if inc == nil {
			return "", "no replica running"
		}
		r.slotOf(inc).kill(inc, f.Hold)
		return fmt.Sprintf("%s (pid %d%s)", inc.id, inc.proc.pid(), why), fmt.Sprintf("SIGKILL; restarts after %s", f.Hold.Round(10*time.Millisecond))

	case FaultPauseReplica:
		inc, why, period := r.pickReplica(ctx, f)
		if inc == nil {
			return "", "no replica running"
		}
		slot := r.slotOf(inc)
		slot.setPaused(inc, true)
		start := time.Now()
		detail = fmt.Sprintf("SIGSTOP for %s", f.Hold.Round(10*time.Millisecond))
		if f.Retrigger && period != "" {
			// A takeover: once the paused owner's lease has run out, another
			// replica is asked to run its period.
			pause(ctx, replicaWatchdogTTL+500*time.Millisecond)
			id := fmt.Sprintf("chaos-%d-takeover-%d", r.cfg.Seed, i)
			r.trigger(ctx, "http", period, id, f.Target, "takeover while "+inc.id+" is paused", inc.id)
			detail += "; billrun:" + period + " triggered on another replica after its lease ran out"
		}
		pause(ctx, f.Hold-time.Since(start))
		slot.setPaused(inc, false)
		return fmt.Sprintf("%s (pid %d%s)", inc.id, inc.proc.pid(), why), detail + "; SIGCONT"

	case FaultKillLockHolder, FaultPauseLockHolder:
		var ls []*lockInc
		waitFor(ctx, 3*time.Second, 20*time.Millisecond, func() bool { ls = r.runningLocks(); return len(ls) > 0 })
		if len(ls) == 0 {
			return "", "no lock held"
		}
		l := ls[f.Target%len(ls)]
		target = fmt.Sprintf("lock pid %d (key %s, worker %d, lease %s)", l.proc.pid(), l.rec.Key, l.rec.Worker, leaseName(l.rec.Lease))
		r.mu.Lock()
		if f.Kind == FaultKillLockHolder {
			l.killed = true
		} else {
			l.paused = true
		}
		r.mu.Unlock()
		if f.Kind == FaultKillLockHolder {
			_ = l.proc.signal(syscall.SIGKILL)
			return target, "SIGKILL while its command runs"
		}
		r.mu.Lock()
		l.pausedNS = Mono()
		r.mu.Unlock()
		_ = l.proc.signal(syscall.SIGSTOP)
		pause(ctx, f.Hold)
		_ = l.proc.signal(syscall.SIGCONT)
		r.mu.Lock()
		l.resumedNS = Mono()
		r.mu.Unlock()
		return target, fmt.Sprintf("SIGSTOP for %s (past its lease), SIGCONT", f.Hold.Round(10*time.Millisecond))

	case FaultPGRestart:
		sig, how := syscall.SIGINT, "fast shutdown (SIGINT)"
		if f.Hard {
			sig, how = syscall.SIGQUIT, "immediate shutdown (SIGQUIT)"
		}
		if f.AlignTick {
			// Half a second before the next bill-run cron tick.
			next := time.Now().Truncate(cronEvery).Add(cronEvery)
			if time.Until(next) < time.Second {
				next = next.Add(cronEvery)
			}
			pause(ctx, time.Until(next)-500*time.Millisecond)
			how += fmt.Sprintf(" just before the cron tick at %s", r.hist.relWall(next))
		}
		r.pg.halt(sig)
		pause(ctx, f.Hold)
		detail = fmt.Sprintf("%s, down %s more, started", how, f.Hold.Round(10*time.Millisecond))
		if err := r.startWithRetry(ctx, r.pg.start); err != nil {
			detail += ": restart failed: " + err.Error()
		}
		return fmt.Sprintf("postgres (port %d)", r.pg.port), detail

	case FaultKafkaRestart:
		sig, how := syscall.SIGTERM, "SIGTERM (controlled shutdown)"
		if f.Hard {
			sig, how = syscall.SIGKILL, "SIGKILL"
		}
		r.kafka.halt(sig)
		pause(ctx, f.Hold)
		detail = fmt.Sprintf("%s, down %s more, started", how, f.Hold.Round(10*time.Millisecond))
		if err := r.startWithRetry(ctx, r.kafka.start); err != nil {
			detail += ": restart failed: " + err.Error()
		}
		return fmt.Sprintf("kafka (port %d)", r.kafka.port), detail

	case FaultPoisonTrigger, FaultOversized:
		detail := r.poison(ctx, i, f)
		return topicBillrun, detail

	case FaultPGLostCommits:
		return r.loseCommits(ctx, f, rec)
	}
	return "", "unknown fault kind"
}

// loseCommits makes PostgreSQL acknowledge commits it has not written:
// synchronous_commit off and the WAL writer's longest delay (server-wide, so
// every session, the verifier's own too, commits asynchronously and nothing
// flushes the WAL early) for f.Hold, then an immediate shutdown, which
// discards the WAL still in shared memory. The settings are reset on disk
// before the crash, so the server comes back synchronous. PostgreSQL loses
// a suffix of its commit history, the same for every table. With Count > 1
// (sabotage mode) it does so Count times in a row.
func (r *run) loseCommits(ctx context.Context, f FaultSpec, rec *FaultRecord) (target, detail string) {
	target = fmt.Sprintf("postgres (port %d)", r.pg.port)
	var parts []string
	for i := 0; i < max(f.Count, 1); i++ {
		d, lost, err := r.loseCommitsOnce(ctx, f.Hold, f.Down, rec)
		parts = append(parts, d)
		if err != nil {
			break
		}
		rec.LostWAL += lost
	}
	return target, strings.Join(parts, "; then ")
}

func (r *run) loseCommitsOnce(ctx context.Context, hold, down time.Duration, rec *FaultRecord) (detail string, lost int64, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(cctx, r.pg.dsn())
	if err != nil {
		return "could not connect: " + err.Error(), 0, err
	}
	defer conn.Close(context.Background())
	for _, q := range []string{
		`alter system set synchronous_commit = off`,
		`alter system set wal_writer_delay = '10s'`,
		`alter system set wal_writer_flush_after = '1GB'`,
		`select pg_reload_conf()`,
	} {
		if _, err := conn.Exec(cctx, q); err != nil {
			return fmt.Sprintf("%s: %v", q, err), 0, err
		}
	}
	pause(ctx, hold)
	qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
	for _, q := range []string{`alter system reset synchronous_commit`, `alter system reset wal_writer_delay`, `alter system reset wal_writer_flush_after`} {
		if _, err := conn.Exec(qctx, q); err != nil {
			detail += fmt.Sprintf("%s: %v; ", q, err)
		}
	}
	// The last moment before the crash: the WAL inserted by then.
	var insertLSN, flushLSN string
	err = conn.QueryRow(qctx, `select pg_current_wal_insert_lsn()::text, pg_current_wal_flush_lsn()::text`).Scan(&insertLSN, &flushLSN)
	qcancel()
	if err != nil {
		detail += "reading the WAL position: " + err.Error() + "; "
	}
	r.pg.halt(syscall.SIGQUIT)
	rec.CrashNS = Mono()
	pause(ctx, down)
	detail += fmt.Sprintf("commits asynchronous (synchronous_commit=off, wal_writer_delay=10s) for %s, then an immediate shutdown (SIGQUIT) with WAL inserted to %s, flushed to %s; down %s more",
		hold.Round(10*time.Millisecond), insertLSN, flushLSN, down.Round(10*time.Millisecond))
	if err := r.startWithRetry(ctx, r.pg.start); err != nil {
		return detail + ": restart failed: " + err.Error(), 0, err
	}
	// Crash recovery ends with a checkpoint: its redo point is where the
	// surviving WAL ends. (Transaction ids do not tell: a transaction whose
	// rows reached the WAL but whose commit record did not is lost all the
	// same, and its id survives.)
	var lostBytes int64
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	defer rcancel()
	if c2, err := pgx.Connect(rctx, r.pg.dsn()); err == nil {
		err = c2.QueryRow(rctx, `select greatest(0, pg_wal_lsn_diff(coalesce(nullif($1, '')::pg_lsn, redo_lsn), redo_lsn))::bigint
from pg_control_checkpoint()`, insertLSN).Scan(&lostBytes)
		c2.Close(context.Background())
		if err != nil {
			detail += "; reading the checkpoint: " + err.Error()
		}
	}
	if lostBytes > 0 {
		detail += fmt.Sprintf("; started: at least %d bytes of WAL (the last commits) did not survive", lostBytes)
	} else {
		detail += "; started: the WAL survived up to the crash"
	}
	lost = lostBytes
	return detail, lost, nil
}

func (r *run) injectRedis(ctx context.Context, f FaultSpec, after func()) (target, detail string) {
	switch f.Kind {
	case FaultRedisRestart:
		m := r.redis.master(ctx)
		if m == nil {
			return "", "the sentinel names no master"
		}
		m.kill()
		if err := m.start(ctx, 0); err != nil {
			return m.name, "restart failed: " + err.Error()
		}
		after()
		synced := r.redis.waitReplicaSynced(ctx, 20*time.Second)
		return fmt.Sprintf("%s (master, port %d)", m.name, m.port), fmt.Sprintf("SIGKILL, started again empty; replica resynced: %v", synced)

	case FaultRedisFailover:
		m := r.redis.master(ctx)
		if m == nil {
			return "", "the sentinel names no master"
		}
		m.kill()
		var nm *redisNode
		promoted := waitFor(ctx, 30*time.Second, 100*time.Millisecond, func() bool {
			nm = r.redis.master(ctx)
			return nm != nil && nm != m
		})
		target = fmt.Sprintf("%s (master, port %d)", m.name, m.port)
		after()
		if !promoted {
			if err := m.start(ctx, 0); err != nil {
				return target, "sentinel did not fail over within 30s, and the restart failed: " + err.Error()
			}
			return target, "SIGKILL; sentinel did not fail over within 30s: restarted the old master"
		}
		if err := m.start(ctx, nm.port); err != nil {
			return target, fmt.Sprintf("SIGKILL; sentinel promoted %s; restarting the old master as its replica failed: %v", nm.name, err)
		}
		synced := r.redis.waitReplicaSynced(ctx, 20*time.Second)
		return target, fmt.Sprintf("SIGKILL; sentinel promoted %s; the old master came back empty as its replica (synced: %v)", nm.name, synced)

	case FaultRedisStall:
		m := r.redis.master(ctx)
		if m == nil {
			return "", "the sentinel names no master"
		}
		c := redis.NewClient(&redis.Options{Addr: m.addr(), ReadTimeout: f.Hold + 10*time.Second, MaxRetries: -1})
		defer c.Close()
		secs := fmt.Sprintf("%.3f", f.Hold.Seconds())
		err := c.Do(ctx, "DEBUG", "SLEEP", secs).Err()
		after()
		detail = fmt.Sprintf("DEBUG SLEEP %s (client read timeout %s)", secs, redisReadTimeout)
		if err != nil {
			detail += ": " + err.Error()
		}
		return fmt.Sprintf("%s (master, port %d)", m.name, m.port), detail

	}
	return "", "unknown fault kind"
}

// takeover sends every RUNNING bill run to a replica other than its owner,
// as a client retrying or a redelivered trigger would after a fault.
func (r *run) takeover(ctx context.Context, i int, f FaultSpec) string {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	runs, err := runningRuns(cctx, r.pool)
	cancel()
	if err != nil {
		return "takeover: " + err.Error()
	}
	var sent []string
	for _, period := range sortedKeys(runs) {
		owner := runs[period]
		id := fmt.Sprintf("chaos-%d-takeover-%d-%s", r.cfg.Seed, i, period)
		r.trigger(ctx, "http", period, id, f.Target, "takeover after "+f.Kind+" (owner "+owner+")", owner)
		sent = append(sent, "billrun:"+period)
	}
	if len(sent) == 0 {
		return "no bill run was RUNNING to take over"
	}
	return "takeover triggers for " + strings.Join(sent, ", ") + " sent to other replicas"
}

func leaseName(d time.Duration) string {
	if d == 0 {
		return "watchdog"
	}
	return d.String()
}

func (r *run) startWithRetry(ctx context.Context, start func(context.Context) error) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = start(ctx); err == nil {
			return nil
		}
		pause(ctx, time.Second)
	}
	return err
}

// pickReplica chooses the fault's replica: with PreferOwner, one that owns a
// RUNNING bill run if any does (and returns that period).
func (r *run) pickReplica(ctx context.Context, f FaultSpec) (*replicaInc, string, string) {
	live := r.liveReplicas()
	if len(live) == 0 {
		return nil, "", ""
	}
	if f.PreferOwner {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		owners, err := runningOwners(cctx, r.pool)
		cancel()
		var cands []*replicaInc
		for _, inc := range live {
			if _, ok := owners[inc.id]; ok && err == nil {
				cands = append(cands, inc)
			}
		}
		if len(cands) > 0 {
			inc := cands[f.Target%len(cands)]
			p := owners[inc.id]
			return inc, ", owner of billrun:" + p, p
		}
	}
	return live[f.Target%len(live)], "", ""
}

// poison produces malformed (or one oversized) bill-run triggers, each
// followed on the same partition (same key) by a valid trigger of a period
// never triggered before, which must still run.
func (r *run) poison(ctx context.Context, i int, f FaultSpec) string {
	var parts []string
	for j := 0; j < max(f.Count, 1); j++ {
		period := r.newPeriod()
		if period == "" { // every period triggered already: repeat the latest
			r.mu.Lock()
			if n := len(r.introduced); n > 0 {
				period = r.introduced[n-1]
			}
			r.mu.Unlock()
		}
		if period == "" {
			return strings.Join(append(parts, "no period to put behind it"), "; ")
		}
		marker := fmt.Sprintf("chaos-%d-poison-%d-%d", r.cfg.Seed, i, j)
		var value []byte
		kind := "poison"
		if f.Kind == FaultOversized {
			kind = "oversized"
			head, _ := json.Marshal(billRunRequest{Period: period, RequestID: marker, RequestedBy: "chaos"})
			const size = 1_020_000
			value = append(append(head[:len(head)-1:len(head)-1], []byte(`,"padding":"`)...), []byte(strings.Repeat("x", size-len(head)-13))...)
			value = append(value, '"', '}')
		} else {
			switch (f.Target + j) % 3 {
			case 0:
				value = []byte("not json: " + marker)
			case 1:
				value, _ = json.Marshal(billRunRequest{Period: "20x6-07", RequestID: marker, RequestedBy: "chaos"})
			default:
				value, _ = json.Marshal(billRunRequest{Period: "2025-13", RequestID: marker, RequestedBy: "chaos"})
			}
		}
		rec := PoisonRecord{Kind: kind, Topic: topicBillrun, Size: len(value), Marker: marker, AtNS: Mono()}
		kr := &kgo.Record{Topic: topicBillrun, Key: []byte(period), Value: value}
		cctx, cancel := context.WithTimeout(ctx, 25*time.Second)
		err := r.kc.ProduceSync(cctx, kr).FirstErr()
		cancel()
		rec.Produced, rec.Partition, rec.Offset = err == nil, kr.Partition, kr.Offset
		if err != nil {
			rec.Error = err.Error()
		}
		r.mu.Lock()
		r.hist.Poison = append(r.hist.Poison, rec)
		r.mu.Unlock()
		r.trigger(ctx, "kafka", period, marker+"-behind", 0, "behind a "+kind+" record", "")
		if err != nil {
			parts = append(parts, fmt.Sprintf("%s record of %d bytes not produced: %v", kind, len(value), err))
		} else {
			parts = append(parts, fmt.Sprintf("%s record of %d bytes at partition %d offset %d, then billrun:%s behind it", kind, len(value), kr.Partition, kr.Offset, period))
		}
	}
	return strings.Join(parts, "; ")
}

// heal undoes whatever a fault left behind when the phase ended: paused
// processes continue, servers that are down start, and the replicas are all
// running again.
func (r *run) heal(ctx context.Context) {
	if err := r.net.healAll(); err != nil {
		r.logf("heal: network: %v", err)
	}
	for _, s := range r.slots {
		s.mu.Lock()
		inc := s.cur
		s.mu.Unlock()
		if inc != nil && inc.paused {
			s.setPaused(inc, false)
		}
	}
	r.mu.Lock()
	for l := range r.locks {
		if l.paused && l.resumedNS == 0 {
			_ = l.proc.signal(syscall.SIGCONT)
			l.resumedNS = Mono()
		}
	}
	r.mu.Unlock()
	if r.pg.proc.exited() {
		r.logf("heal: starting postgres: %v", r.startWithRetry(ctx, r.pg.start))
	}
	if r.kafka.proc.exited() {
		r.logf("heal: starting kafka: %v", r.startWithRetry(ctx, r.kafka.start))
	}
	m := r.redis.master(ctx)
	for _, n := range r.redis.nodes {
		n.mu.Lock()
		down := n.proc.exited()
		n.mu.Unlock()
		if down {
			of := 0
			if m != nil && m != n {
				of = m.port
			}
			r.logf("heal: starting %s: %v", n.name, n.start(ctx, of))
		}
	}
	if !waitFor(ctx, 60*time.Second, 200*time.Millisecond, func() bool { return len(r.liveReplicas()) == len(r.slots) }) {
		r.logf("heal: not every replica is running again after 60s")
	}
}
