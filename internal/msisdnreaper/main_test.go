package msisdnreaper

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// memLocker returns an in-memory locker closed at the end of the test.
func memLocker(t testing.TB, owner string, wait time.Duration) *ownership.MemoryLocker {
	t.Helper()
	l := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: owner, WaitTime: wait, WatchdogTimeout: 3 * time.Second})
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// counts returns the number of rows per state.
func counts(t testing.TB, pg *testenv.PG) map[State]int64 {
	t.Helper()
	rows, err := pg.Pool.Query(context.Background(), `select state, count(*) from msisdn_pool group by state`)
	require.NoError(t, err)
	defer rows.Close()
	out := map[State]int64{}
	for rows.Next() {
		var s State
		var n int64
		require.NoError(t, rows.Scan(&s, &n))
		out[s] = n
	}
	require.NoError(t, rows.Err())
	return out
}
