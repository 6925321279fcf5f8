package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// replicaSlot is one of the deployment's replicas; every (re)start is a new
// incarnation with its own COORDINATOR_REPLICA_ID (r2-3: slot 2, third
// start), so the history can tell a crashed incarnation from its successor.
type replicaSlot struct {
	r   *run
	idx int

	mu    sync.Mutex
	cur   *replicaInc
	n     int
	delay time.Duration // before the next restart (set by kill-replica)
}

// replicaInc is one incarnation.
type replicaInc struct {
	id     string
	proc   *proc
	rec    int // index in History.Replicas
	ready  chan struct{}
	addr   string // HTTP address, once ready
	paused bool
	killed bool
}

func (i *replicaInc) isReady() bool {
	select {
	case <-i.ready:
		return true
	default:
		return false
	}
}

// loop keeps the slot's replica running until ctx ends: a replica that
// exits (killed by a fault, or on its own) is started again.
func (s *replicaSlot) loop(ctx context.Context) {
	for ctx.Err() == nil {
		inc, err := s.start()
		if err != nil {
			s.r.logf("replica slot %d: %v", s.idx, err)
			if !pause(ctx, 2*time.Second) {
				return
			}
			continue
		}
		select {
		case <-inc.proc.done:
		case <-ctx.Done():
			return // the final stop takes it from here
		}
		s.r.recordReplicaExit(inc)
		s.mu.Lock()
		d := s.delay
		s.delay = 0
		s.mu.Unlock()
		if d == 0 {
			d = time.Second
		}
		if !pause(ctx, d) {
			return
		}
	}
}

func (s *replicaSlot) start() (*replicaInc, error) {
	s.mu.Lock()
	s.n++
	id := fmt.Sprintf("r%d-%d", s.idx+1, s.n)
	s.mu.Unlock()
	inc := &replicaInc{id: id, ready: make(chan struct{})}
	var once sync.Once
	seen := map[string]bool{} // request ids of cron attempts already recorded
	lines := func(line string) {
		var l replicaLine
		if json.Unmarshal([]byte(line), &l) != nil {
			return
		}
		if l.Msg == "coordinator_started" {
			once.Do(func() {
				inc.addr = l.Addr
				s.r.markReplicaReady(inc)
				close(inc.ready)
			})
		}
		if c, ok := l.cronLine(id, seen); ok {
			s.r.mu.Lock()
			s.r.hist.CronLines = append(s.r.hist.CronLines, c)
			s.r.mu.Unlock()
		}
	}
	cmd := exec.Command(s.r.cfg.Binaries.Coordinator, "serve")
	cmd.Env = append(s.r.replicaEnv(s.idx), "COORDINATOR_REPLICA_ID="+id)
	p, err := startProc("replica "+id, cmd, procOptions{logPath: filepath.Join(s.r.logs, "replica-"+id+".log"), lines: lines})
	if err != nil {
		return nil, err
	}
	inc.proc = p
	inc.rec = s.r.recordReplicaStart(s.idx, id, p)
	s.mu.Lock()
	s.cur = inc
	s.mu.Unlock()
	return inc, nil
}

// current is the slot's incarnation if it is ready and not paused.
func (s *replicaSlot) current() *replicaInc {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cur == nil || s.cur.proc.exited() || !s.cur.isReady() || s.cur.paused {
		return nil
	}
	return s.cur
}

// kill SIGKILLs the current incarnation; the loop restarts the slot after down.
func (s *replicaSlot) kill(inc *replicaInc, down time.Duration) {
	s.mu.Lock()
	s.delay = down
	inc.killed = true
	s.mu.Unlock()
	s.r.markReplicaKilled(inc)
	_ = inc.proc.signal(syscall.SIGKILL)
	<-inc.proc.done
}

func (s *replicaSlot) setPaused(inc *replicaInc, paused bool) {
	s.mu.Lock()
	inc.paused = paused
	s.mu.Unlock()
	if paused {
		_ = inc.proc.signal(syscall.SIGSTOP)
	} else {
		_ = inc.proc.signal(syscall.SIGCONT)
	}
}

// stop ends the current incarnation gracefully (SIGTERM; after bound
// SIGQUIT, whose goroutine dump lands in its log, then SIGKILL) and records
// it.
func (s *replicaSlot) stop(bound time.Duration) {
	s.mu.Lock()
	inc := s.cur
	s.mu.Unlock()
	if inc == nil {
		return
	}
	if inc.proc.exited() {
		s.r.recordReplicaExit(inc)
		return
	}
	s.r.markReplicaStopped(inc)
	inTime, tail := inc.proc.stopDumping(syscall.SIGTERM, bound, 5*time.Second)
	s.r.recordReplicaExit(inc)
	if !inTime {
		s.r.mu.Lock()
		rec := &s.r.hist.Replicas[inc.rec]
		rec.ShutdownKilled = true
		rec.Tail = tail // its log before the goroutine dump
		s.r.mu.Unlock()
	}
}

// liveReplicas returns the incarnations that are ready and not paused.
func (r *run) liveReplicas() []*replicaInc {
	var out []*replicaInc
	for _, s := range r.slots {
		if inc := s.current(); inc != nil {
			out = append(out, inc)
		}
	}
	return out
}

func (r *run) slotOf(inc *replicaInc) *replicaSlot {
	for _, s := range r.slots {
		s.mu.Lock()
		cur := s.cur
		s.mu.Unlock()
		if cur == inc {
			return s
		}
	}
	return nil
}

func (r *run) recordReplicaStart(slot int, id string, p *proc) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hist.Replicas = append(r.hist.Replicas, ReplicaRun{ID: id, Slot: slot, PID: p.pid(), StartNS: p.startNS})
	return len(r.hist.Replicas) - 1
}

func (r *run) markReplicaReady(inc *replicaInc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hist.Replicas[inc.rec].ReadyNS = Mono()
}

func (r *run) markReplicaKilled(inc *replicaInc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hist.Replicas[inc.rec].KilledByVerifier = true
}

func (r *run) markReplicaStopped(inc *replicaInc) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hist.Replicas[inc.rec].StoppedByVerifier = true
}

func (r *run) recordReplicaExit(inc *replicaInc) {
	<-inc.proc.done
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := &r.hist.Replicas[inc.rec]
	if rec.ExitNS != 0 {
		return
	}
	rec.ExitNS = inc.proc.exitNS
	rec.Exit = inc.proc.exitCode()
	rec.Tail = inc.proc.tailLines(12)
}

// replicaLine is what the verifier reads of a replica's JSON log line.
type replicaLine struct {
	Time      time.Time `json:"time"`
	Msg       string    `json:"msg"`
	Addr      string    `json:"http_addr"`
	Job       string    `json:"job"`
	Trigger   string    `json:"trigger"`
	RequestID string    `json:"request_id"`
	Outcome   string    `json:"outcome"`
	Deferred  bool      `json:"deferred"`
	Scheduled time.Time `json:"scheduled"`
}

// cronLine keeps the lines about bill-run cron ticks the tick check needs:
// an attempt's first line and its trigger_dispatched, catch-ups and skips.
func (l replicaLine) cronLine(replica string, seen map[string]bool) (CronLine, bool) {
	if l.Job != "billrun" {
		return CronLine{}, false
	}
	c := CronLine{Replica: replica, Msg: l.Msg, RequestID: l.RequestID, Time: l.Time}
	switch {
	case l.Msg == "cron_tick_skipped":
		c.Scheduled = l.Scheduled
		return c, true
	case l.Msg == "cron_catchup_tick":
		c.Scheduled = l.Scheduled
		seen[l.RequestID] = true
		return c, true
	case l.Trigger != "cron" || l.RequestID == "":
		return CronLine{}, false
	case l.Msg == "trigger_dispatched":
		c.Outcome, c.Deferred = l.Outcome, l.Deferred
		seen[l.RequestID] = true
		return c, true
	case !seen[l.RequestID]:
		seen[l.RequestID] = true
		return c, true
	}
	return CronLine{}, false
}
