package demo

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/telco-platform/coordinator/internal/cronspec"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func testBinaries(t *testing.T) Binaries {
	t.Helper()
	bins, err := FindBinaries(os.Getenv(testenv.EnvRedisServerBin), os.Getenv(testenv.EnvPGBinDir))
	require.NoError(t, err, "the demo test needs redis-server and PostgreSQL (make services-up installs them)")
	return bins
}

// TestDemoShowsOneRunAndWhoOwnsIt runs the whole demo, small: the run is
// slowed so that it outlasts the five triggers, which then all meet the
// owner's lock.
func TestDemoShowsOneRunAndWhoOwnsIt(t *testing.T) {
	var out bytes.Buffer
	// The demo's temporary directory goes into one of this test's own, so
	// that checking it is gone afterwards sees no other process's demo (the
	// system's temporary directory is shared). Readable by all: the demo's
	// Postgres runs as the postgres OS user when we are root.
	tmp, err := os.MkdirTemp("", "demo-test-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(tmp) })
	require.NoError(t, os.Chmod(tmp, 0o755))
	t.Setenv("TMPDIR", tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	err = Run(ctx, Config{
		Subscribers: 6000, StaleReservations: 500, BatchSize: 1000, batchPause: 1500 * time.Millisecond,
		Binaries: testBinaries(t), Out: &out, Timeout: 90 * time.Second,
	})
	t.Log("\n" + out.String())
	require.NoError(t, err)

	text := out.String()
	completed := regexp.MustCompile(`(?m)^\s+[+-][0-9.]+s\s+(coordinator-\d)\s+run\.completed\s+billrun:\d{4}-\d{2}\s`).FindAllStringSubmatch(text, -1)
	require.Len(t, completed, 1, "exactly one run.completed for the bill run")
	owner := completed[0][1]
	acquired := regexp.MustCompile(`(?m)^\s+[+-][0-9.]+s\s+(coordinator-\d)\s+ownership\.acquired\s+billrun:`).FindAllStringSubmatch(text, -1)
	require.NotEmpty(t, acquired)
	require.Equal(t, owner, acquired[0][1], "the first to acquire is the one that completed")

	already := regexp.MustCompile(`(?m)^\s+[+-][0-9.]+s\s+coordinator-\d\s+ownership\.already_owned\s+billrun:\S+\s+via (\w+)\s+owner=(\S+)`).FindAllStringSubmatch(text, -1)
	require.GreaterOrEqual(t, len(already), 2, "the other triggers are told the lock is owned")
	for _, m := range already {
		require.Equal(t, owner, m[2], "already_owned names the owner")
	}
	require.Contains(t, text, "triggers answered: kafka 1, http 1, cron 3")
	seeded := regexp.MustCompile(`seeded\s+6000 subscribers \((\d+) ACTIVE\)`).FindStringSubmatch(text)
	require.NotNil(t, seeded)
	require.Contains(t, text, "invoices="+seeded[1]+" for "+seeded[1]+" ACTIVE subscribers, duplicates=0")
	require.Contains(t, text, "0 stale reservations left (of 500)")
	// The open month is refused before anything runs.
	require.Regexp(t, `the open month \d{4}-\d{2}: HTTP POST /v1/billruns to coordinator-\d answered 422 reason=period_not_closed code=BAD_INPUT`, text)
	// The HTTP call either met the owner's lock (409 naming it) or, reaching
	// the lock first, was the owner (202).
	httpAnswer := regexp.MustCompile(`HTTP POST /v1/billruns to coordinator-\d answered (\d+)(.*)`).FindStringSubmatch(text)
	require.NotNil(t, httpAnswer)
	switch httpAnswer[1] {
	case "409":
		require.Contains(t, httpAnswer[2], "owner="+owner)
	case "202":
		require.Contains(t, text, "via http  fence=", "the HTTP trigger acquired")
	default:
		t.Fatalf("HTTP answered %s", httpAnswer[0])
	}

	// Nothing left behind: the temporary directory is gone (goleak checks
	// the goroutines; the child processes were waited for).
	left, err := os.ReadDir(tmp)
	require.NoError(t, err)
	require.Empty(t, left, "the demo left files in its temporary directory")
}

func TestFindBinariesNamesWhatToInstall(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, err := FindBinaries(filepath.Join(dir, "redis-server"), "")
	require.ErrorIs(t, err, ErrMissingBinary)
	require.NotContains(t, err.Error(), "\n")
	require.Contains(t, err.Error(), "apt-get install redis-server")

	_, err = FindBinaries("", dir)
	require.ErrorIs(t, err, ErrMissingBinary)
	require.NotContains(t, err.Error(), "\n")
	require.Contains(t, err.Error(), "apt-get install postgresql")
}

func TestCronAtFiresAtThatSecond(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 2, 13, 4, 5, 0, time.UTC)
	spec := cronAt(at)
	require.Equal(t, "CRON_TZ=UTC 5 4 13 2 12 *", spec)
	s, err := cronspec.Parse(spec)
	require.NoError(t, err)
	require.Equal(t, at, s.Next(at.Add(-time.Second)).UTC())
}

func TestSummaryCountsAnswersPerTrigger(t *testing.T) {
	t.Parallel()
	ev := func(typ events.Type, replica, trigger, owner string) events.CloudEvent {
		return events.Event{Type: typ, Key: "billrun:2026-11", Job: "billrun", Replica: replica, Trigger: trigger, Owner: owner}.Cloud()
	}
	all := []events.CloudEvent{
		ev(events.OwnershipAcquired, "a", "cron", ""),
		ev(events.OwnershipAlreadyOwned, "b", "cron", "a"),
		ev(events.OwnershipAlreadyOwned, "c", "kafka", ""),
		ev(events.RunCompleted, "a", "cron", ""),
		ev(events.OwnershipReleased, "a", "cron", ""),
		ev(events.OwnershipAcquired, "b", "http", ""),
		ev(events.RunAlreadyCompleted, "b", "http", "a"),
	}
	s := summarise(all, "billrun:2026-11")
	require.Equal(t, 4, s.answeredTotal())
	require.Equal(t, map[string]int{"cron": 2, "kafka": 1, "http": 1}, s.billAnswered)
	require.Len(t, s.billCompleted, 1)
	require.True(t, s.billReleased)
	require.Equal(t, 1, s.alreadyOwnedBad, "an already_owned without owner is flagged")
	require.Equal(t, 2, s.replicas["b"].acquired+s.replicas["b"].alreadyOwned)

	var buf bytes.Buffer
	s.print(&buf)
	require.Equal(t, 4, strings.Count(buf.String(), "\n"), "a header and one row per replica")
}
