package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The fenced store accepts each key's holders one after another; a holder
// accepted again after a newer holder's write (equal fences let it in), or
// an accepted fence below the one before it, is two writers accepted.
func TestCheckFencedWrites(t *testing.T) {
	w := func(id int64, key, holder string, fence int64, ok bool) FencedWrite {
		return FencedWrite{ID: id, Key: key, Holder: holder, Fence: fence, Accepted: ok}
	}
	h := &History{FencedWrites: []FencedWrite{
		w(1, "k", "iw0-1", 5, true), w(2, "k", "iw0-1", 5, true),
		w(3, "k", "iw1-1", 7, true),
		w(4, "k", "iw0-1", 5, false), // the cut-off holder, refused: the store did its job
		w(5, "k", "iw1-1", 7, true),
		w(6, "j", "iw2-1", 3, true), w(7, "k", "iw0-2", 9, true),
	}}
	requireKinds(t, checkFencedWrites(h))

	// An old holder accepted again after a newer one: only an equal fence
	// gets it past the store.
	h.FencedWrites = []FencedWrite{w(1, "k", "iw0-1", 5, true), w(2, "k", "iw1-1", 5, true), w(3, "k", "iw0-1", 5, true)}
	got := checkFencedWrites(h)
	requireKinds(t, got, KindTwoWritersAccepted)
	require.Contains(t, got[0].Detail, "iw0-1's write #3")

	// The store accepted a lower fence: its own check failed.
	h.FencedWrites = []FencedWrite{w(1, "k", "iw0-1", 7, true), w(2, "k", "iw1-1", 5, true)}
	got = checkFencedWrites(h)
	requireKinds(t, got, KindTwoWritersAccepted)
	require.Contains(t, got[0].Detail, "fence check does not hold")
}

// Fences of in-process acquisitions increase where one acquisition surely
// followed another (Acquire called after the other had returned).
func TestCheckInprocFences(t *testing.T) {
	s := func(holder string, fence, call, acquired int64) InprocSection {
		return InprocSection{Key: "k", Holder: holder, Fence: fence, CallNS: call * sec, AcquiredNS: acquired * sec, EndNS: (acquired + 1) * sec}
	}
	h := &History{Inproc: []InprocSection{
		s("iw0-1", 10, 1, 2),
		s("iw1-1", 20, 3, 4),
		// Called before iw1-1's Acquire returned: the order is unknown.
		s("iw0-2", 15, 3, 6),
		{Key: "other", Holder: "iw2-1", Fence: 1, CallNS: 9 * sec, AcquiredNS: 9 * sec},
	}}
	requireKinds(t, checkInprocFences(h))

	h.Inproc = append(h.Inproc, s("iw1-2", 20, 7, 8)) // after iw1-1 (20) returned: must be above 20
	got := checkInprocFences(h)
	requireKinds(t, got, KindFenceNotIncreasing)
	require.Contains(t, got[0].Detail, "iw1-2")
}

// A partition from Redis that began while an in-process worker held a
// lease is reported with what became of the holder.
func TestCutOffs(t *testing.T) {
	h := &History{
		Faults: []FaultRecord{
			{Spec: FaultSpec{Kind: FaultPartitionRedis}, Host: "iw0", Holder: "iw0-3", StartNS: 10 * sec, EndNS: 18 * sec},
			{Spec: FaultSpec{Kind: FaultLatency}, Host: "iw1", Holder: "iw1-2", StartNS: 10 * sec, EndNS: 18 * sec}, // not a partition
		},
		Inproc: []InprocSection{{Key: "k", Holder: "iw0-3", Fence: 5, CallNS: 9 * sec, AcquiredNS: 9 * sec, EndNS: 14 * sec, LostNS: 13 * sec}},
		FencedWrites: []FencedWrite{
			{ID: 1, Key: "k", Holder: "iw0-3", Fence: 5, Accepted: true, MonoNS: 9 * sec},
			{ID: 2, Key: "k", Holder: "iw1-4", Fence: 8, Accepted: true, MonoNS: 15 * sec},
			{ID: 3, Key: "k", Holder: "iw0-3", Fence: 5, Accepted: false, MonoNS: 16 * sec},
		},
	}
	cs := h.cutOffs()
	require.Len(t, cs, 1)
	require.Equal(t, "iw1-4", cs[0].newer.Holder)
	require.Equal(t, 1, cs[0].refused)
	require.Equal(t, 0, cs[0].acceptedAf)
	require.Contains(t, cs[0].String(h), "iw0-3 (fence 5)")
	require.Contains(t, cs[0].String(h), "refused by the store: 1")
}

// A run.completed whose COMPLETED update PostgreSQL lost (published in a
// lost-commit fault's window, its id stored nowhere) is excused; the same
// event outside the window is a second completion.
func TestCheckEventsExcusesCompletionsLostWithCommits(t *testing.T) {
	wall := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	completed := func(id string, at time.Duration) Event {
		return Event{ID: id, Type: "run.completed", Subject: "billrun:2026-01", Replica: "r1-1", Time: wall.Add(at)}
	}
	h := &History{
		StartNS: 1 * sec, WallStart: wall,
		Faults:     []FaultRecord{{Spec: FaultSpec{Kind: FaultPGLostCommits}, StartNS: 11 * sec, CrashNS: 15 * sec, EndNS: 17 * sec}},
		BillRuns:   []BillRunRow{{Period: "2026-01", Status: "COMPLETED", Owner: "r2-1", EventID: "second"}},
		BillRunLog: []BillRunChange{{Period: "2026-01", Status: "COMPLETED", EventID: "second"}},
		Events:     []Event{completed("first", 12*time.Second), completed("second", 30*time.Second)},
	}
	requireKinds(t, checkEvents(h))
	require.Equal(t, map[string]bool{"first": true}, h.completionsLostWithCommits())

	h.Events[0].Time = wall.Add(5 * time.Second) // before the fault: not lost with it
	requireKinds(t, checkEvents(h), KindEventsRunCompleted)
	h.Events[0].Time = wall.Add(12 * time.Second)
	h.BillRunLog = append(h.BillRunLog, BillRunChange{Period: "2026-01", Status: "COMPLETED", EventID: "first"}) // it survived
	requireKinds(t, checkEvents(h), KindEventsRunCompleted)
}

// A bill-run owner cut off from Redis: the newer claim of its period and
// the batches the cut-off owner committed after it are reported.
func TestOwnerCutOffs(t *testing.T) {
	wall := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return wall.Add(time.Duration(s) * time.Second) }
	h := &History{
		StartNS: 1 * sec, WallStart: wall,
		Faults: []FaultRecord{{Spec: FaultSpec{Kind: FaultPartitionRedis}, Host: "r2", Replica: "r2-1", Period: "2026-04", StartNS: 11 * sec, EndNS: 19 * sec}},
		BillRunLog: []BillRunChange{
			{Period: "2026-04", Owner: "r2-1", Status: "RUNNING", Fence: 1, CommittedAt: at(5)},
			{Period: "2026-04", Owner: "r3-1", Status: "RUNNING", Fence: 2, CommittedAt: at(15)},
		},
		Batches: []BatchRow{
			{Period: "2026-04", Owner: "r2-1", Fence: 1, CommittedAt: at(12)},
			{Period: "2026-04", Owner: "r3-1", Fence: 2, CommittedAt: at(16)},
		},
	}
	cs := h.ownerCutOffs()
	require.Len(t, cs, 1)
	require.EqualValues(t, 1, cs[0].fence)
	require.Equal(t, "r3-1", cs[0].newer.Owner)
	require.Equal(t, 0, cs[0].after)
	require.Contains(t, cs[0].String(h), "r3-1 claimed it with fence 2")

	h.Batches = append(h.Batches, BatchRow{Period: "2026-04", Owner: "r2-1", Fence: 1, CommittedAt: at(17)})
	require.Equal(t, 1, h.ownerCutOffs()[0].after, "a batch of the cut-off owner after the newer claim")
	requireKinds(t, checkBatchFences(h), KindStaleBatchCommit)
}
