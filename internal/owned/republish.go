package owned

import (
	"context"
	"time"

	"github.com/telco-platform/coordinator/internal/events"
)

// republishAll re-publishes the unacknowledged completions of every
// kind with Completions.
func (s *Resumer) republishAll(ctx context.Context) {
	for _, k := range s.recorders {
		if ctx.Err() != nil {
			return
		}
		s.republish(ctx, k)
	}
}

// republish publishes again the run.completed of k's completions that no
// sink acknowledged within RepublishAfter (their owner was killed with the
// event in its buffer, or the buffer dropped it), with the id the owner
// gave it (stored with the completion), data.replica the owner and data.fence the
// claim's; data.republished_by names this replica. The completion is marked
// only once the sink acknowledged this event; one dropped again stays for a
// later scan. Replicas may re-publish one completion each: the copies share
// the id (at least once).
func (s *Resumer) republish(ctx context.Context, k Kind) {
	name := k.Spec().Name
	w := s.cfg.Runner.workers[name]
	s.repMu.Lock()
	defer s.repMu.Unlock()
	now := time.Now()
	for id, at := range s.republished {
		if now.Sub(at) >= s.cfg.RepublishAfter {
			delete(s.republished, id)
		}
	}
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	list, err := w.unpublished(lctx, s.cfg.RepublishAfter, republishLimit)
	cancel()
	if err != nil {
		s.log.Warn("republish_list_failed", "job", name, "error", err)
		return
	}
	replica := s.cfg.Runner.Replica()
	for _, c := range list {
		key := k.LockKey(c.Params)
		id := c.EventID
		if _, ok := s.republished[id]; ok {
			continue // still waiting in this replica's sink, or just marked
		}
		s.republished[id] = now
		extra := make(map[string]any, len(c.Counts)+3)
		for k, v := range c.Counts {
			extra[k] = v
		}
		if c.LockFence != 0 {
			extra["lock_fence"] = c.LockFence
		}
		extra["republished"] = true
		extra["republished_by"] = replica
		e := events.Event{ID: id, Time: c.Finished, Type: events.RunCompleted, Key: key, Job: name, Replica: c.Owner,
			Trigger: string(c.Trigger.Source), RequestID: c.Trigger.RequestID, RequestedBy: c.Trigger.RequestedBy,
			Principal: c.Trigger.Principal, Fence: c.Fence, Extra: extra}
		log := s.log.With("job", name, "lock_key", key, "fence", c.Fence)
		log.Warn("run_completed_republished", "event_id", id, "owner", c.Owner, "finished_at", c.Finished,
			"detail", "no acknowledgement of its run.completed was recorded: published again with the same id")
		s.m.republished.WithLabelValues(name).Inc()
		events.EmitAcked(context.WithoutCancel(ctx), s.cfg.Runner.emit, e, s.cfg.Runner.markPublished(w, c.Params, c.Fence, log))
	}
}
