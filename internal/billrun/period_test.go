package billrun_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
)

func TestParsePeriod(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"2000-01", "2026-11", "2999-12"} {
		p, err := billrun.ParsePeriod(in)
		require.NoError(t, err, in)
		require.Equal(t, in, p.String())
		require.True(t, p.Valid())
	}
	for _, in := range []string{"", "2026-1", "2026-13", "2026-00", "1999-12", "3000-01", "2026/11", "26-11", "2026-11 ", "２026-11", "+026-11", "2026-1a"} {
		_, err := billrun.ParsePeriod(in)
		require.Error(t, err, in)
		require.True(t, errors.Is(err, job.ErrBadInput), in)
		require.Contains(t, err.Error(), "\""+strings.TrimSpace(in), "the message names the value: %v", err)
	}
}

func TestPeriodPreviousAndKey(t *testing.T) {
	t.Parallel()
	p, err := billrun.ParsePeriod("2026-01")
	require.NoError(t, err)
	require.Equal(t, "2025-12", p.Previous().String())
	require.Equal(t, "2026-10", billrun.Period{Year: 2026, Month: time.November}.Previous().String())
	require.Equal(t, "billrun:2026-11", billrun.LockKey(billrun.Period{Year: 2026, Month: time.November}))
	require.False(t, billrun.Period{Year: 2000, Month: time.January}.Previous().Valid())
	require.Equal(t, "2026-11", billrun.PeriodOf(time.Date(2026, 11, 30, 23, 0, 0, 0, time.UTC)).String())

	var q billrun.Period
	require.NoError(t, q.UnmarshalText([]byte("2031-07")))
	b, err := q.MarshalText()
	require.NoError(t, err)
	require.Equal(t, "2031-07", string(b))
	require.ErrorIs(t, q.UnmarshalText([]byte("2031-7")), job.ErrBadInput)
}
