package trigger

import (
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
)

// A key with nothing pending is started before the lanes that go round with
// more of their backlog: a new period's trigger behind a replay's duplicates
// waits for a free handler, not for a turn behind every key of the replay.
// Before, lanes were started in the order they became ready, so b-1 came
// after a-2 here (the test failed with "a" where it wants "b"); with fresh
// keys first but a replayed key counted as fresh, z-1 came after x-1 and
// y-1.
func TestAFreshKeyGoesBeforeTheBacklogGoingRound(t *testing.T) {
	t.Parallel()
	w := &partWorker{lanes: map[string]*lane{}}
	var offset int64
	add := func(keys ...string) {
		for _, k := range keys {
			w.queue = append(w.queue, &kgo.Record{Key: []byte(k), Offset: offset})
			offset++
		}
		w.fillLanesLocked()
	}
	// start takes the next lane to start and its head record.
	start := func() (*lane, *entry) {
		l := w.nextLaneLocked()
		require.NotNil(t, l, "a lane is ready")
		return l, l.recs[0]
	}

	add("a", "a", "a", "c", "c")
	la, a1 := start()
	lc, c1 := start()
	require.Equal(t, []string{"a", "c"}, []string{la.key, lc.key}, "fresh keys in arrival order")
	w.handledLocked(la, a1) // a goes round with a-2, a-3
	add("b")                // a new key behind the backlog
	w.handledLocked(lc, c1) // c goes round with c-2

	var order []string
	for {
		l := w.nextLaneLocked()
		if l == nil {
			break
		}
		order = append(order, l.key)
		w.handledLocked(l, l.recs[0])
	}
	require.Equal(t, []string{"b", "a", "c", "a"}, order, "the fresh key first, then the backlog in turn")
	require.Empty(t, w.lanes)
	require.Zero(t, w.buffered)

	// Keys whose backlog arrived before their first record started (a
	// replay) wait behind a key with one record that came after them.
	add("x", "x", "y", "y", "z")
	order = nil
	for {
		l := w.nextLaneLocked()
		if l == nil {
			break
		}
		order = append(order, l.key)
		w.handledLocked(l, l.recs[0])
	}
	require.Equal(t, []string{"z", "x", "y", "x", "y"}, order)
}

// A handler goes on with its lane's next record only while no other lane
// waits: the lanes still take turns.
func TestAHandlerKeepsItsLaneOnlyWhileNoOtherWaits(t *testing.T) {
	t.Parallel()
	w := &partWorker{lanes: map[string]*lane{}}
	for i, k := range []string{"a", "a", "a"} {
		w.queue = append(w.queue, &kgo.Record{Key: []byte(k), Offset: int64(i)})
	}
	w.fillLanesLocked()
	l := w.nextLaneLocked()
	w.handledLocked(l, l.recs[0])
	require.True(t, w.keepLocked(l), "alone: the handler goes on")
	require.Empty(t, w.ready)

	w.queue = append(w.queue, &kgo.Record{Key: []byte("b"), Offset: 3})
	w.handledLocked(l, l.recs[0])
	require.False(t, w.keepLocked(l), "records not yet in lanes: the loop must see them")
	w.fillLanesLocked()
	require.False(t, w.keepLocked(l), "another lane waits")
	require.Equal(t, "b", w.nextLaneLocked().key)
	require.Equal(t, l, w.nextLaneLocked())

	w.revoked = true
	w.ready = append(w.ready, l)
	require.False(t, w.keepLocked(l), "the partition is going")
}
