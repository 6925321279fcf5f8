package owned

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// Defaults of ResumerConfig.
const (
	DefaultResumeInterval    = 15 * time.Second
	DefaultResumeMaxAttempts = 10
	// DefaultResumeConcurrency is how many resumed runs one replica's
	// resumer runs at once.
	DefaultResumeConcurrency = 2
	// maxResumeBackoff caps the delay between two attempts of one request.
	maxResumeBackoff = time.Hour
	// DefaultRepublishAfter is how long a completion may stay unmarked
	// before the resumers publish its run.completed again
	// (COORDINATOR_EVENTS_REPUBLISH_AFTER): far longer than a live owner's
	// sink takes to deliver (milliseconds; seconds across a broker
	// restart), so a re-publication nearly always means the owner died with
	// the event in its buffer, or the buffer dropped it.
	DefaultRepublishAfter = 2 * time.Minute
	// republishLimit bounds the completions one scan re-publishes per kind.
	republishLimit = 100
	// expiryMargin is how long after a held lock's observed TTL end the
	// next scan looks again: the lock of an owner that died is gone by
	// then (Redis expires keys on their TTL), so its run is resumed within
	// about the TTL of the kill, not the TTL plus a scan interval.
	expiryMargin = 50 * time.Millisecond
	// minRescan bounds how soon after a scan another one may start.
	minRescan = 10 * time.Millisecond
)

// ResumerConfig configures a Resumer.
type ResumerConfig struct {
	// Runner is the template, with the kinds to resume (those whose Worker
	// has Incomplete) and the database. Required, with a database.
	Runner *Runner
	// Run runs one resumed run to its end. Default Runner.Run; a replica
	// passes its dispatcher's, so that shutdown bounds resumed runs like
	// any other.
	Run func(ctx context.Context, k Kind, p Params, t job.Trigger) job.Result
	// Interval is how often the incomplete runs are looked for
	// (COORDINATOR_RESUME_INTERVAL). Default 15s. The first attempt of a
	// request is due at once; the next ones back off from Interval,
	// doubling, capped at 1h.
	Interval time.Duration
	// MaxAttempts bounds the attempts of one request that run and do not
	// complete (lost, a retryable failure); then it is permanent and pages
	// (COORDINATOR_RESUME_MAX_ATTEMPTS). Attempts that find the lock owned
	// or unavailable, or are cut short by a shutdown, do not count.
	// Default 10.
	MaxAttempts int
	// Concurrency bounds the resumed runs this resumer runs at once, each
	// in a goroutine of its own: a scan never waits for them, so a replica
	// busy resuming one long run still resumes another whose owner died.
	// Default DefaultResumeConcurrency.
	Concurrency int
	// Locks, when set, lets a scan skip the runs whose lock is held (their
	// owner is working) instead of waiting for it, and look again as soon
	// as the earliest of those locks would expire (its TTL as the scan saw
	// it): an owner killed mid-run is resumed about its lock's TTL after
	// the kill, not up to Interval later. Optional.
	Locks ownership.Inspector
	// RepublishAfter is how long a completion of a kind with Completions
	// stays unacknowledged before a scan publishes its run.completed again
	// (COORDINATOR_EVENTS_REPUBLISH_AFTER). Default DefaultRepublishAfter.
	// A replica re-publishes one event at most once per RepublishAfter.
	RepublishAfter time.Duration
	// Log defaults to discard.
	Log *slog.Logger
	// Registerer gets the resumer's metrics. Nil: not registered.
	Registerer prometheus.Registerer
}

// Resumer finishes, on every replica, the runs that were accepted and did
// not complete: every Interval it asks each resumable kind for its
// incomplete runs (recording those it did not know in run_requests), reads
// the kind's requests, sets the incomplete-run metrics, and runs the due
// ones, Concurrency at a time, each in a goroutine of its own (a scan never
// waits for them), through the template with trigger source
// job.SourceResume and the request's request id. A due run whose lock is
// held is looked at again when that lock's TTL ends (a dead owner's). The
// lock decides which replica resumes a run; the others find it owned.
//
// A run that completes (or finds itself completed) clears its request; one
// that fails permanently stays FAILED and its request permanent; one lost or
// failed for a transient cause is tried again after a backoff, up to
// MaxAttempts, then made permanent (resume_gave_up).
type Resumer struct {
	cfg   ResumerConfig
	reqs  *requests
	log   *slog.Logger
	m     *resumerMetrics
	kinds []Kind
	// recorders are the kinds whose Worker has Completions;
	// republished the ids this replica re-published and when, so an event
	// waiting in its sink is not queued again (under repMu).
	recorders   []Kind
	repMu       sync.Mutex
	republished map[string]time.Time

	// attempting are the lock keys of the attempts in flight (under amu),
	// at most cfg.Concurrency; attempts tracks their goroutines. A due run
	// that finds no free slot waits for a later scan (another replica's,
	// likely): waking the loop when an attempt ends would turn attempts
	// that end at once (already_owned, due again at once) into a busy loop.
	amu        sync.Mutex
	attempting map[string]bool
	attempts   sync.WaitGroup

	ctx    context.Context
	cancel context.CancelFunc
	mu     sync.Mutex
	began  bool
	done   chan struct{}
	once   sync.Once
}

// NewResumer validates cfg; nothing is contacted until Start.
func NewResumer(cfg ResumerConfig) (*Resumer, error) {
	if cfg.Runner == nil || cfg.Runner.requests == nil {
		return nil, errors.New("owned: NewResumer needs a Runner with a database")
	}
	if cfg.Interval < 0 || cfg.MaxAttempts < 0 || cfg.RepublishAfter < 0 || cfg.Concurrency < 0 {
		return nil, fmt.Errorf("owned: resumer interval %s, max attempts %d, republish after %s and concurrency %d must not be negative",
			cfg.Interval, cfg.MaxAttempts, cfg.RepublishAfter, cfg.Concurrency)
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultResumeConcurrency
	}
	if cfg.RepublishAfter == 0 {
		cfg.RepublishAfter = DefaultRepublishAfter
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultResumeInterval
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultResumeMaxAttempts
	}
	if cfg.Run == nil {
		cfg.Run = cfg.Runner.Run
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	m, err := newResumerMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Resumer{cfg: cfg, reqs: cfg.Runner.requests, log: cfg.Log, m: m, done: make(chan struct{}),
		republished: map[string]time.Time{}, attempting: map[string]bool{}}
	for _, k := range cfg.Runner.reg.Kinds() {
		w := cfg.Runner.workers[k.Spec().Name]
		if w.incomplete != nil {
			s.kinds = append(s.kinds, k)
			m.reset(k.Spec().Name)
		}
		if w.records != nil {
			s.recorders = append(s.recorders, k)
			m.republished.WithLabelValues(k.Spec().Name)
		}
	}
	byName := func(ks []Kind) func(i, j int) bool {
		return func(i, j int) bool { return ks[i].Spec().Name < ks[j].Spec().Name }
	}
	sort.Slice(s.kinds, byName(s.kinds))
	sort.Slice(s.recorders, byName(s.recorders))
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

// Kinds are the names of the kinds this Resumer resumes.
func (s *Resumer) Kinds() []string {
	out := make([]string, len(s.kinds))
	for i, k := range s.kinds {
		out[i] = k.Spec().Name
	}
	return out
}

// Start scans at once and then every Interval (sooner when a held lock of
// a due run may expire), in the background.
func (s *Resumer) Start(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.began {
		return errors.New("owned: resumer already started")
	}
	s.began = true
	go s.loop()
	s.log.Info("resumer_started", "kinds", s.Kinds(), "interval", s.cfg.Interval, "max_attempts", s.cfg.MaxAttempts,
		"republish_after", s.cfg.RepublishAfter, "concurrency", s.cfg.Concurrency)
	return nil
}

// Stop stops scanning, cancels the resumed runs in flight (they end lost at
// their next checkpoint and release; their requests stay due) and waits. A
// replica stops its dispatcher first, whose bound has ended those runs
// already. Safe twice.
func (s *Resumer) Stop() {
	s.once.Do(func() {
		s.cancel()
		s.mu.Lock()
		began := s.began
		s.began = true // no Start after Stop
		s.mu.Unlock()
		if began {
			<-s.done
		}
	})
}

func (s *Resumer) loop() {
	defer close(s.done)
	defer s.attempts.Wait()
	// Re-publication on a loop of its own: a scan that lists many runs must
	// not hold up a lost run.completed.
	var wg sync.WaitGroup
	if len(s.recorders) > 0 {
		wg.Go(func() {
			s.every(func(ctx context.Context) time.Time {
				s.republishAll(ctx)
				return time.Time{}
			})
		})
	}
	s.every(s.resumeAll)
	wg.Wait()
}

// every runs scan now and then again Interval after it ended, or sooner:
// at the time scan returns, when that is not zero (the end of a held lock's
// TTL), until Stop.
func (s *Resumer) every(scan func(context.Context) time.Time) {
	for {
		wait := s.cfg.Interval
		if at := scan(s.ctx); !at.IsZero() {
			wait = max(min(wait, time.Until(at)), minRescan)
		}
		t := time.NewTimer(wait)
		select {
		case <-s.ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// Scan re-publishes the unacknowledged completions of every
// kind with Completions, then looks once for incomplete runs of every
// resumable kind, runs the due ones (Concurrency at a time) and waits for
// them. The loop runs the two on loops of their own and does not wait for
// the runs; tests call Scan.
func (s *Resumer) Scan(ctx context.Context) {
	s.republishAll(ctx)
	s.resumeAll(ctx)
	s.attempts.Wait()
}

// resumeAll looks once for incomplete runs of every resumable kind and
// starts the due ones, each in a goroutine of its own (at most
// Concurrency in flight, one per lock key; the others wait for a later
// scan). It returns
// when to look again for the due runs it skipped because their lock was
// held: the earliest end of those locks' TTLs as listed, plus expiryMargin
// (zero: none). A live owner renews its lock before then, and the next scan
// sees the new TTL; a dead owner's lock is gone, and its run is resumed.
func (s *Resumer) resumeAll(ctx context.Context) time.Time {
	var next time.Time
	for _, k := range s.kinds {
		if ctx.Err() != nil {
			return next
		}
		if at := s.scanKind(ctx, k); !at.IsZero() && (next.IsZero() || at.Before(next)) {
			next = at
		}
	}
	return next
}

// heldLocks lists the locks held now (Locks), each with when its TTL, as
// listed, ends plus expiryMargin (zero: no TTL). Nil without an Inspector or
// when the listing fails: nothing is skipped, the lock decides.
func (s *Resumer) heldLocks(ctx context.Context) map[string]time.Time {
	if s.cfg.Locks == nil {
		return nil
	}
	lctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	listed := time.Now()
	locks, err := s.cfg.Locks.Locks(lctx)
	if err != nil {
		return nil
	}
	held := make(map[string]time.Time, len(locks))
	for _, l := range locks {
		var end time.Time
		if l.TTL > 0 {
			end = listed.Add(l.TTL + expiryMargin)
		}
		held[l.Key] = end
	}
	return held
}

// scanKind adopts, lists and runs k's due requests; it returns when the
// earliest lock of a due request it skipped as held may have expired (zero:
// none).
func (s *Resumer) scanKind(ctx context.Context, k Kind) time.Time {
	name := k.Spec().Name
	w := s.cfg.Runner.workers[name]
	lctx, cancel := context.WithTimeout(ctx, 4*requestTimeout)
	inc, err := w.incomplete(lctx)
	if err != nil {
		s.log.Warn("resume_list_failed", "job", name, "error", err)
	}
	for _, in := range inc {
		q, err := encodeRequest(k, in.Params, in.Trigger)
		if err != nil {
			s.log.Error("resume_adopt_failed", "job", name, "error", err)
			continue
		}
		if !in.Since.IsZero() {
			since := in.Since
			q.acceptedAt = &since
		}
		q.lastOutcome = in.State
		if err := s.reqs.adopt(lctx, q); err != nil {
			s.log.Warn("resume_adopt_failed", "job", name, "lock_key", q.key, "error", err)
		}
	}
	reqs, err := s.reqs.list(lctx, name)
	cancel()
	if err != nil {
		s.log.Warn("resume_list_failed", "job", name, "error", err)
		return time.Time{}
	}
	s.m.observe(name, reqs)
	// The locks are listed after the runs: a run claimed after the lock
	// listing but before the run listing would look incomplete and free,
	// and be attempted while it runs (its lock makes that a wasted
	// attempt, with events of its own).
	held := s.heldLocks(ctx)
	var due []request
	var expiry time.Time
	for _, q := range reqs {
		if q.permanent || !q.due || s.inFlight(q.key) {
			continue
		}
		end, locked := held[q.key]
		if !locked {
			due = append(due, q)
			continue
		}
		if !end.IsZero() && (expiry.IsZero() || end.Before(expiry)) {
			expiry = end
		}
	}
	// Replicas scan alike; a random order spreads them over the runs.
	rand.Shuffle(len(due), func(i, j int) { due[i], due[j] = due[j], due[i] })
	for _, q := range due {
		if ctx.Err() != nil || !s.take(q.key) {
			return expiry
		}
		s.attempts.Go(func() {
			defer s.give(q.key)
			s.attempt(ctx, k, q)
		})
	}
	return expiry
}

// inFlight reports whether this resumer is attempting the run of key.
func (s *Resumer) inFlight(key string) bool {
	s.amu.Lock()
	defer s.amu.Unlock()
	return s.attempting[key]
}

// take reserves an attempt slot for key: false when Concurrency attempts
// are in flight (or key's is).
func (s *Resumer) take(key string) bool {
	s.amu.Lock()
	defer s.amu.Unlock()
	if s.attempting[key] || len(s.attempting) >= s.cfg.Concurrency {
		return false
	}
	s.attempting[key] = true
	return true
}

// give frees key's slot.
func (s *Resumer) give(key string) {
	s.amu.Lock()
	defer s.amu.Unlock()
	delete(s.attempting, key)
}

// attempt runs one due request and books how it ended.
func (s *Resumer) attempt(ctx context.Context, k Kind, q request) {
	log := s.log.With("job", q.job, "lock_key", q.key, "attempt", q.attempts+1)
	// book runs a statement on run_requests after the attempt (which may have
	// taken hours), under its own bound, also when ctx is ending.
	book := func(f func(ctx context.Context) error) error {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), requestTimeout)
		defer cancel()
		return f(bctx)
	}
	p, err := q.decode(k)
	if err != nil {
		log.Error("resume_gave_up", "error", err, "detail", "the recorded request does not decode")
		s.m.gaveUp.WithLabelValues(q.job).Inc()
		msg := "the recorded request does not decode: " + err.Error()
		if err := book(func(ctx context.Context) error { return s.reqs.giveUp(ctx, q, msg) }); err != nil {
			log.Warn("resume_book_failed", "error", err)
		}
		return
	}
	t := job.Trigger{Source: job.SourceResume, RequestID: q.trigger.RequestID, RequestedBy: q.trigger.RequestedBy}
	if t.RequestID == "" {
		t.RequestID = events.NewID()
	}
	if t.RequestedBy == "" {
		t.RequestedBy = s.cfg.Runner.Replica()
	}
	log.Info("resume_attempt", "request_id", t.RequestID, "accepted_trigger", string(q.trigger.Source))
	res := s.cfg.Run(ctx, k, p, t)
	s.m.attempts.WithLabelValues(q.job, string(res.Outcome)).Inc()
	var count bool
	switch res.Outcome {
	case job.OutcomeCompleted, job.OutcomeAlreadyCompleted:
		log.Info("resume_completed", "outcome", string(res.Outcome), "fence", res.Fence)
		return
	case job.OutcomeFailed:
		if !res.Retryable { // the template recorded it permanent
			log.Error("resume_failed_permanently", "error", res.Error)
			s.m.gaveUp.WithLabelValues(q.job).Inc()
			return
		}
		count = true
	case job.OutcomeLost:
		// A replica shutting down (a deploy) is not the run's failure: it
		// is tried again at once, uncounted.
		count = ctx.Err() == nil && !strings.HasPrefix(res.Error, "ownership lost: "+ReasonShutdown)
	}
	delay := time.Duration(0)
	if count {
		delay = min(s.cfg.Interval<<min(q.attempts, 16), maxResumeBackoff)
	}
	var permanent bool
	err = book(func(ctx context.Context) (err error) {
		permanent, err = s.reqs.attempted(ctx, q, count, delay, s.cfg.MaxAttempts, res.Outcome, res.Error)
		return err
	})
	switch {
	case err != nil:
		log.Warn("resume_book_failed", "error", err)
	case permanent:
		log.Error("resume_gave_up", "outcome", string(res.Outcome), "error", res.Error,
			"detail", "attempts spent: the request is permanent; see docs/runbook.md")
		s.m.gaveUp.WithLabelValues(q.job).Inc()
	default:
		log.Warn("resume_not_completed", "outcome", string(res.Outcome), "error", res.Error, "retry_in", delay)
	}
}
