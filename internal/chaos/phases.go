package chaos

// The phases of a run: the fault phase, the recovery phase, and reading
// the history back.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// exercise runs the fault phase and the recovery phase and reads the
// history back.
func (r *run) exercise(ctx context.Context) error {
	replicaCtx, stopReplicas := context.WithCancel(context.WithoutCancel(ctx))
	defer stopReplicas()
	var replicasWG sync.WaitGroup
	for _, s := range r.slots {
		replicasWG.Go(func() { s.loop(replicaCtx) })
	}
	if !waitFor(ctx, replicaReadyBound, 100*time.Millisecond, func() bool { return len(r.liveReplicas()) == len(r.slots) }) {
		var tails []string
		for _, s := range r.slots {
			s.mu.Lock()
			if s.cur != nil {
				tails = append(tails, s.cur.id+": "+strings.Join(s.cur.proc.tailLines(4), " | "))
			}
			s.mu.Unlock()
		}
		return fmt.Errorf("%w: the replicas did not all start within %s: %s", ErrSetup, replicaReadyBound, strings.Join(tails, " || "))
	}

	r.mu.Lock()
	r.hist.StartNS, r.hist.WallStart = Mono(), time.Now()
	r.hist.CronEvery = cronEvery
	r.mu.Unlock()
	r.logf("fault phase: %s, %d faults planned (seed %d)", r.cfg.Duration, len(r.plan), r.cfg.Seed)
	phase, endPhase := context.WithTimeout(ctx, r.cfg.Duration)
	defer endPhase()
	r.phase = phase
	r.workWG.Go(func() { r.triggerLoop(phase) })
	r.workWG.Go(func() { r.cronTicks(phase) })
	r.workWG.Go(func() { r.reservationFeeder(phase) })
	for w := 0; w < r.cfg.LockWorkers; w++ {
		r.workWG.Go(func() { r.lockWorker(phase, w) })
	}
	for _, iw := range r.inproc {
		r.workWG.Go(func() { iw.loop(phase) })
	}
	var faultsWG sync.WaitGroup
	faultsWG.Go(func() { r.runFaults(phase, r.plan) })
	faultsWG.Go(func() { r.runFaults(phase, r.netPlan) })
	faultsWG.Wait()
	<-phase.Done()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	r.logf("fault phase over: healing what is still broken, draining the workload")
	r.heal(ctx)
	drained := make(chan struct{})
	go func() { r.workWG.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(workloadDrainBound):
		r.logf("workload did not drain within %s; killing the remaining lock processes", workloadDrainBound)
		r.killLocks()
		<-drained
	}
	r.mu.Lock()
	r.hist.FaultsEndNS = Mono()
	r.mu.Unlock()

	r.recover(ctx)
	r.finalTreeCheck(ctx)

	r.logf("stopping the replicas (SIGTERM, %s bound)", shutdownTimeout+10*time.Second)
	stopReplicas()
	replicasWG.Wait()
	var stopWG sync.WaitGroup
	for _, s := range r.slots {
		stopWG.Go(func() { s.stop(shutdownTimeout + 10*time.Second) })
	}
	stopWG.Wait()
	return r.readHistory(ctx)
}

// recover is the quiet phase: no faults, no new triggers; it ends when every
// accepted bill run is COMPLETED and the reaper freed every expired
// reservation, or at the bound.
func (r *run) recover(ctx context.Context) {
	r.logf("recovery phase: waiting up to %s for every accepted bill run to complete", r.cfg.Recovery)
	start := time.Now()
	r.mu.Lock()
	why, _ := r.hist.acceptedPeriods()
	r.mu.Unlock()
	var pending []string
	var unacked int // COMPLETED, run.completed not yet acknowledged: a resumer re-publishes it
	done := waitFor(ctx, r.cfg.Recovery, time.Second, func() bool {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		st, err := billRunStatuses(cctx, r.pool)
		if err != nil {
			return false
		}
		pending = pending[:0]
		for p := range why {
			if st[p] != "COMPLETED" {
				pending = append(pending, p)
			}
		}
		if unacked, err = unackedCompletions(cctx, r.pool); err != nil {
			return false
		}
		ps, err := loadPool(cctx, r.pool, reaperEvery)
		return err == nil && len(pending) == 0 && unacked == 0 && ps.StaleLeft == 0
	})
	r.mu.Lock()
	r.hist.CheckNS = Mono()
	r.mu.Unlock()
	if done {
		r.logf("recovered in %s", time.Since(start).Round(100*time.Millisecond))
	} else {
		r.logf("not recovered within %s: %d bill runs not COMPLETED, %d run.completed not acknowledged", r.cfg.Recovery, len(pending), unacked)
	}
}

// readHistory reads the product's tables, the helpers' rows, the events and
// the dead letters.
func (r *run) readHistory(ctx context.Context) error {
	r.logf("reading the history back")
	cctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	h := &r.hist
	var err error
	if h.Sections, err = loadSections(cctx, r.pool); err != nil {
		return fmt.Errorf("read sections: %w", err)
	}
	if h.Writes, err = loadWrites(cctx, r.pool); err != nil {
		return fmt.Errorf("read writes: %w", err)
	}
	if h.Procs, err = loadProcs(cctx, r.pool, "order by started_ns"); err != nil {
		return fmt.Errorf("read procs: %w", err)
	}
	if h.BillRuns, err = loadBillRuns(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_runs: %w", err)
	}
	if h.BillRunLog, err = loadBillRunLog(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_runs changes: %w", err)
	}
	if h.Batches, err = loadBatches(cctx, r.pool); err != nil {
		return fmt.Errorf("read bill_run_batches: %w", err)
	}
	if h.FencedWrites, err = loadFencedWrites(cctx, r.pool); err != nil {
		return fmt.Errorf("read fenced writes: %w", err)
	}
	r.mu.Lock()
	periods := append([]string{r.cronP}, r.introduced...)
	r.mu.Unlock()
	if h.Invoices, err = loadInvoiceStats(cctx, r.pool, periods); err != nil {
		return fmt.Errorf("read invoices: %w", err)
	}
	if h.Pool, err = loadPool(cctx, r.pool, reaperEvery); err != nil {
		return fmt.Errorf("read msisdn_pool: %w", err)
	}
	h.Pool.StaleSeen = r.staleSeen
	if h.Events, err = readEvents(cctx, r.kafka.brokers()); err != nil {
		return fmt.Errorf("read events: %w", err)
	}
	if h.DLQ, err = readDLQ(cctx, r.kafka.brokers()); err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}
	return nil
}
