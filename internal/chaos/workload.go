package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/robfig/cron/v3"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ---------------------------------------------------------------- periods

// planPeriods picks the periods: the cron schedule bills the previous month
// (cron only); Kafka and HTTP triggers walk back from the month before it
// to 2000-01, newest first.
func (r *run) planPeriods(now time.Time) {
	first := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
	prev := first.AddDate(0, -1, 0)
	r.cronP = prev.Format("2006-01")
	for m := prev.AddDate(0, -1, 0); m.Year() >= 2000; m = m.AddDate(0, -1, 0) {
		r.periods = append(r.periods, m.Format("2006-01"))
	}
	r.cronSpec = cronSpecFor()
}

// cronEvery is the bill-run schedule's interval: a tick every 10 s, each
// billing the month before it (the same period all run long), so that many
// ticks meet the faults and each must run or be recorded (checkCronTicks).
const cronEvery = 10 * time.Second

// cronSpecFor is the bill-run schedule: every cronEvery, on the second (UTC).
func cronSpecFor() string {
	return fmt.Sprintf("CRON_TZ=UTC */%d * * * * *", int(cronEvery.Seconds()))
}

var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// cronTicks records each tick of the bill-run schedule that falls in the
// fault phase while at least one replica runs (ready, not stopped): the
// replicas that fire it must run it or record it (and then run it), and
// the period it bills must end COMPLETED, without any other trigger.
func (r *run) cronTicks(ctx context.Context) {
	sched, err := cronParser.Parse(r.cronSpec)
	if err != nil {
		r.logf("cron spec %q: %v", r.cronSpec, err)
		return
	}
	for t := sched.Next(time.Now()); ; t = sched.Next(t) {
		if !pause(ctx, time.Until(t)) {
			return
		}
		live := r.liveReplicas()
		if len(live) == 0 {
			r.logf("bill-run cron tick with no replica running")
			continue
		}
		var ids []string
		for _, inc := range live {
			ids = append(ids, inc.id)
		}
		period := time.Date(t.UTC().Year(), t.UTC().Month(), 1, 0, 0, 0, 0, time.UTC).AddDate(0, -1, 0).Format("2006-01")
		r.mu.Lock()
		r.hist.CronTicks = append(r.hist.CronTicks, CronTick{AtNS: Mono(), At: t, Period: period, Live: ids})
		r.mu.Unlock()
	}
}

// ---------------------------------------------------------- reservations

const (
	staleBatch = 150
	liveBatch  = 20
)

func (r *run) addReservations(ctx context.Context) error {
	r.mu.Lock()
	r.reserveN++
	n := r.reserveN
	r.mu.Unlock()
	if err := seedReservations(ctx, r.pool, n, staleBatch, liveBatch); err != nil {
		return err
	}
	r.mu.Lock()
	r.staleSeen += staleBatch
	r.mu.Unlock()
	return nil
}

// reservationFeeder keeps giving the reaper expired reservations to free.
func (r *run) reservationFeeder(ctx context.Context) {
	for pause(ctx, 7*time.Second) {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = r.addReservations(cctx) // Postgres may be down: skip this round
		cancel()
	}
}

// --------------------------------------------------------------- triggers

type billRunRequest struct {
	Period      string `json:"period"`
	RequestID   string `json:"request_id"`
	RequestedBy string `json:"requested_by"`
}

// triggerLoop introduces a new period every 1.5-3.5 s, stretched on phases
// too long for the periods back to 2000-01 (sometimes it repeats an old one
// instead) and triggers it 1-3 times, from Kafka and
// HTTP, spread over a few seconds.
func (r *run) triggerLoop(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x7216))
	n := 0
	var wg sync.WaitGroup
	defer wg.Wait()
	// Long phases space the periods out, so that new ones last to the end.
	stretch := max(1, float64(r.cfg.Duration)/(float64(len(r.periods))*float64(2500*time.Millisecond)*0.85))
	lo, hi := time.Duration(1500*float64(time.Millisecond)*stretch), time.Duration(3500*float64(time.Millisecond)*stretch)
	for pause(ctx, between(rng, lo, hi)) {
		period := ""
		if rng.IntN(100) >= 15 {
			period = r.newPeriod()
		}
		if period == "" {
			r.mu.Lock()
			if len(r.introduced) > 0 {
				period = r.introduced[rng.IntN(len(r.introduced))]
			}
			r.mu.Unlock()
		}
		if period == "" {
			// The first draw chose a repeat before any period was introduced.
			if period = r.newPeriod(); period == "" {
				continue
			}
		}
		count := 1 + rng.IntN(3)
		for i := 0; i < count; i++ {
			n++
			src := "kafka"
			if rng.IntN(100) < 45 {
				src = "http"
			}
			delay := time.Duration(0)
			if i > 0 {
				delay = between(rng, 0, 3*time.Second)
			}
			pick := rng.IntN(1 << 16)
			id := fmt.Sprintf("chaos-%d-%d", r.cfg.Seed, n)
			wg.Go(func() {
				if !pause(ctx, delay) {
					return
				}
				r.trigger(context.WithoutCancel(ctx), src, period, id, pick, "", "")
			})
		}
	}
}

// newPeriod introduces the next period never triggered before ("" when
// every period has been).
func (r *run) newPeriod() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.nextPeriod >= len(r.periods) {
		return ""
	}
	p := r.periods[r.nextPeriod]
	r.nextPeriod++
	r.introduced = append(r.introduced, p)
	return p
}

// HTTP triggers are sent again the way the contract tells a client to: a
// 503 or 429 (every one says "retryable": true) after its Retry-After, and
// a request that reached no replica (its replica died under it) at once,
// on another replica, up to maxHTTPRetries times while the fault phase
// lasts (the recovery phase sends nothing).
const (
	maxHTTPRetries    = 6
	defaultRetryAfter = 5 * time.Second
	maxRetryAfter     = 10 * time.Second
)

// trigger sends one bill-run trigger, and an HTTP one again while it is
// refused with an answer to retry; every attempt is a record of its own.
func (r *run) trigger(ctx context.Context, src, period, id string, pick int, note, avoid string) {
	for attempt := 0; ; attempt++ {
		rec, retryAfter := r.triggerOnce(ctx, src, period, id, pick+attempt, note, avoid)
		rec.Attempt = attempt
		r.mu.Lock()
		r.hist.Triggers = append(r.hist.Triggers, rec)
		r.mu.Unlock()
		if src != "http" || rec.Accepted || attempt >= maxHTTPRetries ||
			(rec.Status != 0 && rec.Status != http.StatusServiceUnavailable && rec.Status != http.StatusTooManyRequests) {
			return
		}
		if r.phase == nil || !pause(r.phase, retryAfter) {
			return
		}
	}
}

func (r *run) triggerOnce(ctx context.Context, src, period, id string, pick int, note, avoid string) (TriggerRecord, time.Duration) {
	rec := TriggerRecord{Source: src, Period: period, RequestID: id, AtNS: Mono(), Note: note}
	body, _ := json.Marshal(billRunRequest{Period: period, RequestID: id, RequestedBy: "chaos"})
	var retryAfter time.Duration
	switch src {
	case "kafka":
		cctx, cancel := context.WithTimeout(ctx, 25*time.Second)
		err := r.kc.ProduceSync(cctx, &kgo.Record{Topic: topicBillrun, Key: []byte(period), Value: body}).FirstErr()
		cancel()
		rec.Accepted = err == nil
		if err != nil {
			rec.Error = err.Error()
		}
	case "http":
		rec.Status, rec.Replica, rec.Error, retryAfter = r.postBillRun(ctx, body, pick, avoid)
		rec.Accepted = rec.Status == http.StatusAccepted || rec.Status == http.StatusOK || rec.Status == http.StatusConflict
	}
	return rec, retryAfter
}

// postBillRun posts to a live replica (pick chooses among them; avoid names
// one not to use) and returns the status, the replica, an error text and
// how long to wait before sending it again (Retry-After; 0 without an
// answer).
func (r *run) postBillRun(ctx context.Context, body []byte, pick int, avoid string) (int, string, string, time.Duration) {
	var live []*replicaInc
	for _, inc := range r.liveReplicas() {
		if inc.id != avoid {
			live = append(live, inc)
		}
	}
	if len(live) == 0 {
		return 0, "", "no replica running", time.Second
	}
	inc := live[pick%len(live)]
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, http.MethodPost, "http://"+inc.addr+"/v1/billruns", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer "+r.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
	if err != nil {
		return 0, inc.id, err.Error(), 0
	}
	resp.Body.Close()
	retryAfter := defaultRetryAfter
	if secs, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && secs >= 0 {
		retryAfter = min(time.Duration(secs)*time.Second, maxRetryAfter)
	}
	return resp.StatusCode, inc.id, "", retryAfter
}

// ------------------------------------------------------------ lock workers

// lockInc is one running `coordinator lock` process.
type lockInc struct {
	proc    *proc
	rec     LockRun
	holding chan struct{} // closed when it logged lock_acquired
	paused  bool
	killed  bool
	// pausedNS, resumedNS: when the verifier stopped and continued it.
	pausedNS, resumedNS int64
}

func (l *lockInc) isHolding() bool {
	select {
	case <-l.holding:
		return true
	default:
		return false
	}
}

// lockWorker runs `coordinator lock` around the helper over and over on one
// key, with parameters drawn from the seed: an explicit lease or the
// watchdog, how long the section takes, how many fenced rows it appends,
// and now and then a child left running behind it (escaped from the
// process group or not) or a section that overruns its lease and ignores
// SIGTERM.
func (r *run) lockWorker(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x10c0+uint64(w)))
	key := fmt.Sprintf("chaos-lock-%d", w%r.cfg.LockKeys)
	for n := 1; ctx.Err() == nil; n++ {
		var lease time.Duration
		if rng.IntN(100) < 60 {
			lease = time.Duration(2+rng.IntN(2)) * time.Second
		}
		hold := between(rng, 50*time.Millisecond, 400*time.Millisecond)
		writes := 1 + rng.IntN(3)
		helper := []string{r.cfg.Binaries.Helper, "critical", "--hold", hold.String(), "--writes", strconv.Itoa(writes)}
		switch x := rng.IntN(100); {
		case x < 8:
			helper = append(helper, "--linger", between(rng, 1500*time.Millisecond, 3*time.Second).String())
			if rng.IntN(2) == 0 {
				helper = append(helper, "--escape")
			}
		case x < 12 && lease > 0:
			// Overruns its lease and ignores SIGTERM: the lock must kill it
			// before another holder can get in.
			helper[3] = (lease + 1500*time.Millisecond).String()
			helper = append(helper, "--stubborn")
		}
		args := []string{"lock", "--key", key, "--wait", "2s", "--grace", "300ms"}
		if lease > 0 {
			args = append(args, "--lease", lease.String())
		}
		args = append(append(args, "--"), helper...)
		r.runLock(ctx, w, n, key, lease, args)
		pause(ctx, between(rng, 0, 150*time.Millisecond))
	}
}

func (r *run) runLock(ctx context.Context, w, n int, key string, lease time.Duration, args []string) {
	cmd := exec.Command(r.cfg.Binaries.Coordinator, args...)
	cmd.Env = append(r.commonEnv(lockHost(w)),
		"COORDINATOR_LOCK_WATCHDOG_TIMEOUT="+lockWatchdogTTL.String(),
		fmt.Sprintf("COORDINATOR_REPLICA_ID=lw%d-%d", w, n),
		EnvHelperDSN+"="+r.pg.dsn())
	li := &lockInc{holding: make(chan struct{})}
	var once sync.Once
	lines := func(line string) {
		if strings.Contains(line, `"lock_acquired"`) {
			once.Do(func() { close(li.holding) })
		}
	}
	p, err := startProc(fmt.Sprintf("lock lw%d-%d", w, n), cmd, procOptions{logPath: filepath.Join(r.logs, fmt.Sprintf("locks-w%d.log", w)), lines: lines})
	if err != nil {
		r.logf("lock worker %d: %v", w, err)
		pause(ctx, time.Second)
		return
	}
	li.proc = p
	li.rec = LockRun{Worker: w, Key: key, PID: p.pid(), StartTime: p.startTime, StartNS: p.startNS, Lease: lease}
	r.mu.Lock()
	r.locks[li] = struct{}{}
	r.mu.Unlock()
	<-p.done
	r.mu.Lock()
	delete(r.locks, li)
	li.rec.ExitNS, li.rec.Exit = p.exitNS, p.exitCode()
	li.rec.Killed, li.rec.Paused = li.killed, li.paused
	li.rec.PausedNS, li.rec.ResumedNS = li.pausedNS, li.resumedNS
	if li.rec.Exit != 0 {
		li.rec.Tail = p.tailLines(6)
	}
	r.hist.LockRuns = append(r.hist.LockRuns, li.rec)
	r.mu.Unlock()
	r.checkTreeGone(li.rec)
}

// checkTreeGone looks, shortly after a `coordinator lock` exited, for
// processes of its command's tree that are still running.
func (r *run) checkTreeGone(l LockRun) {
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	procs, err := loadProcs(ctx, r.pool, "where lock_pid = $1 and lock_start = $2", l.PID, int64(l.StartTime))
	if err != nil {
		return // Postgres down: the final check still looks
	}
	now := Mono()
	for _, p := range procs {
		if aliveProc(p.PID, p.StartTime) {
			r.mu.Lock()
			r.hist.StillRunning = append(r.hist.StillRunning, StillRunning{HelperProc: p, HolderExitNS: l.ExitNS, SeenNS: now})
			r.mu.Unlock()
		}
	}
}

// finalTreeCheck kills whatever the helpers left running (the verifier
// stops everything it caused) after recording it.
func (r *run) finalTreeCheck(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	procs, err := loadProcs(cctx, r.pool, "")
	if err != nil {
		r.logf("final process check: %v", err)
		return
	}
	now := Mono()
	r.mu.Lock()
	holders := map[holderKey]LockRun{}
	for _, l := range r.hist.LockRuns {
		holders[holderKey{l.PID, l.StartTime}] = l
	}
	seen := map[int]bool{}
	for _, s := range r.hist.StillRunning {
		seen[s.PID] = true
	}
	r.mu.Unlock()
	for _, p := range procs {
		if !aliveProc(p.PID, p.StartTime) {
			continue
		}
		if l, ok := holders[holderKey{p.LockPID, p.LockStart}]; ok && l.ExitNS > 0 && !seen[p.PID] {
			r.mu.Lock()
			r.hist.StillRunning = append(r.hist.StillRunning, StillRunning{HelperProc: p, HolderExitNS: l.ExitNS, SeenNS: now})
			r.mu.Unlock()
		}
		killProc(p.PID, p.StartTime)
	}
}

// runningLocks returns the lock processes whose command runs (lock held).
func (r *run) runningLocks() []*lockInc {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*lockInc
	for l := range r.locks {
		if l.isHolding() && !l.paused && !l.proc.exited() {
			out = append(out, l)
		}
	}
	// Map order is random: sort for a stable choice by the fault's target.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j].rec.StartNS < out[j-1].rec.StartNS; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

func (r *run) killLocks() {
	r.mu.Lock()
	var all []*lockInc
	for l := range r.locks {
		all = append(all, l)
	}
	r.mu.Unlock()
	for _, l := range all {
		_ = l.proc.signal(syscall.SIGKILL)
	}
}
