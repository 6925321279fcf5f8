package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A dropped cron tick (every replica's attempt failed and none went on
// trying) is reported; ticks that ran, were recorded, were taken over by a
// retry into the next interval, or whose attempt died with its replica are
// not.
func TestCheckCronTicks(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(tick int, d time.Duration) time.Time { return t0.Add(time.Duration(tick)*10*time.Second + d) }
	ms := time.Millisecond
	attempt := func(replica, id string, tick int, start, end time.Duration, outcome string, deferred bool) []CronLine {
		ls := []CronLine{{Replica: replica, Msg: "run_claimed", RequestID: id, Time: at(tick, start)}}
		if outcome != "" {
			ls = append(ls, CronLine{Replica: replica, Msg: "trigger_dispatched", RequestID: id, Time: at(tick, end), Outcome: outcome, Deferred: deferred})
		}
		return ls
	}
	var ticks []CronTick
	for i := 0; i < 10; i++ {
		ticks = append(ticks, CronTick{At: at(i, 0), Period: "2026-11", Live: []string{"r1-1", "r2-1"}})
	}
	var lines []CronLine
	add := func(ls ...[]CronLine) {
		for _, l := range ls {
			lines = append(lines, l...)
		}
	}
	add(attempt("r1-1", "a0", 0, 5*ms, 6*time.Second, "completed", false),
		attempt("r2-1", "b0", 0, 3*ms, 1*time.Second, "already_owned", false))
	// Tick 1 is dropped: both failed within 3.2 s, nothing retried.
	add(attempt("r1-1", "a1", 1, 5*ms, 3200*ms, "failed", false),
		attempt("r2-1", "b1", 1, 5*ms, 1100*ms, "unavailable", false))
	// Tick 2: every attempt failed, but one retried until 8 s after the tick.
	add(attempt("r1-1", "a2", 2, 5*ms, 8*time.Second, "failed", false))
	// Tick 3: recorded for the resumer.
	add(attempt("r1-1", "a3", 3, 5*ms, 2*time.Second, "failed", true))
	// Tick 4: its attempt logged no end (the replica was killed in it).
	add(attempt("r3-1", "c4", 4, 5*ms, 0, "", false))
	// Tick 5: skipped, the previous tick still ran.
	lines = append(lines, CronLine{Replica: "r1-1", Msg: "cron_tick_skipped", Time: at(5, ms), Scheduled: at(5, 0)})
	// Tick 6: nothing logged. Tick 7: caught up by a restarted replica later.
	lines = append(lines, CronLine{Replica: "r3-2", Msg: "cron_catchup_tick", RequestID: "c7", Time: at(9, 0), Scheduled: at(7, 0)},
		CronLine{Replica: "r3-2", Msg: "trigger_dispatched", RequestID: "c7", Time: at(9, time.Second), Outcome: "already_completed"})
	// Tick 8's run outlasts tick 9: r2-1 skips tick 9 for it, r1-1 finds
	// the lock held and cannot record; tick 9 is answered by the run.
	add(attempt("r2-1", "b8", 8, 5*ms, 12*time.Second, "completed", false),
		attempt("r1-1", "a9", 9, 5*ms, time.Second, "already_owned", false))
	lines = append(lines, CronLine{Replica: "r2-1", Msg: "cron_tick_skipped", Time: at(9, ms), Scheduled: at(9, 0)})
	h := &History{WallStart: t0, CronEvery: 10 * time.Second, CronTicks: ticks, CronLines: lines,
		Replicas: []ReplicaRun{{ID: "r1-1", StoppedByVerifier: true, ExitNS: 99 * sec}, {ID: "r2-1", StoppedByVerifier: true, ExitNS: 99 * sec},
			{ID: "r3-1", KilledByVerifier: true, ExitNS: 41 * sec}}}

	got := checkCronTicks(h)
	requireKinds(t, got, KindCronTickDropped)
	require.Contains(t, got[0].Detail, "+10.0s")
	require.Contains(t, got[0].Detail, "r1-1 failed")
	how := map[int]string{}
	for i, v := range h.cronVerdicts() {
		how[i] = v.how
	}
	require.Equal(t, map[int]string{0: "ran", 1: "dropped", 2: "superseded", 3: "recorded", 4: "in_flight", 5: "skipped", 6: "unobserved", 7: "ran",
		8: "ran", 9: "ran"}, how)

	// Had tick 8's run failed unrecorded 2 s into tick 9, tick 9 would be
	// dropped (tick 8 went on past the middle of its interval: superseded).
	for i, l := range h.CronLines {
		if l.RequestID == "b8" && l.Msg == "trigger_dispatched" {
			h.CronLines[i].Outcome = "failed"
		}
	}
	got = checkCronTicks(h)
	requireKinds(t, got, KindCronTickDropped, KindCronTickDropped)
	require.Contains(t, got[1].Detail, "r2-1 (skipped it: an earlier tick's attempt ran on) failed")
	for i, l := range h.CronLines {
		if l.RequestID == "b8" && l.Msg == "trigger_dispatched" {
			h.CronLines[i].Outcome = "completed"
		}
	}

	// An attempt that never ended on a replica that lived to the end hung:
	// it answers for nothing.
	h.Replicas[2] = ReplicaRun{ID: "r3-1", StoppedByVerifier: true, ExitNS: 99 * sec}
	got = checkCronTicks(h)
	requireKinds(t, got, KindCronTickDropped, KindCronTickDropped)
	require.Contains(t, got[1].Detail, "hung")
	h.Replicas[2] = ReplicaRun{ID: "r3-1", KilledByVerifier: true, ExitNS: 41 * sec}

	// The same tick with one attempt that went on trying, or recorded it,
	// is not dropped.
	h.CronLines = append(h.CronLines, attempt("r2-1", "b1r", 1, 4*time.Second, 9*time.Second, "failed", false)...)
	requireKinds(t, checkCronTicks(h))
	h.CronLines = append(lines, attempt("r2-1", "b1d", 1, 2*time.Second, 3*time.Second, "already_owned", true)...)
	requireKinds(t, checkCronTicks(h))

	// No interval recorded (an old history): nothing to judge.
	h.CronEvery = 0
	require.Empty(t, checkCronTicks(h))
}
