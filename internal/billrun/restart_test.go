package billrun_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/migrate"
	"github.com/telco-platform/coordinator/internal/ownership"
	"github.com/telco-platform/coordinator/internal/postgres"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// pgServer is a throwaway PostgreSQL of the test's own (never the shared
// one), run as the postgres OS user, that the test may stop and restart.
type pgServer struct {
	t       *testing.T
	bin     string
	dataDir string
	port    int
	dsn     string
	asUser  []string
}

func startOwnPostgres(t *testing.T) *pgServer {
	t.Helper()
	bin := testenv.Binary(t, testenv.EnvPGBinDir, "/usr/lib/postgresql/15/bin")
	testenv.Binary(t, "", filepath.Join(bin, "pg_ctl"))
	s := &pgServer{t: t, bin: bin}
	dir, err := os.MkdirTemp("", "billrun-pg-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	if os.Geteuid() == 0 { // initdb refuses root: run as postgres
		u, err := user.Lookup("postgres")
		require.NoError(t, err, "a postgres OS user is needed to run a throwaway server as root")
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		require.NoError(t, os.Chown(dir, uid, gid))
		s.asUser = []string{"runuser", "-u", "postgres", "--"}
	}
	s.dataDir = filepath.Join(dir, "data")
	s.port = freePort(t)
	s.run("initdb", "-D", s.dataDir, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync")
	conf := fmt.Sprintf("port = %d\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '%s'\nfsync = off\nsynchronous_commit = off\nfull_page_writes = off\n", s.port, dir)
	f, err := os.OpenFile(filepath.Join(s.dataDir, "postgresql.conf"), os.O_APPEND|os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteString(conf)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	s.start()
	t.Cleanup(func() { s.ctl("stop", "-m", "immediate") })
	s.dsn = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
	return s
}

func (s *pgServer) run(prog string, args ...string) {
	s.t.Helper()
	argv := append(append(append([]string{}, s.asUser...), filepath.Join(s.bin, prog)), args...)
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	require.NoError(s.t, err, "%s: %s", prog, out)
}

// ctl runs pg_ctl. Its output goes to a file, not a pipe: the server it
// starts would inherit a pipe and keep it open, and reading it would never end.
func (s *pgServer) ctl(args ...string) {
	argv := append(append(append([]string{}, s.asUser...), filepath.Join(s.bin, "pg_ctl"), "-D", s.dataDir, "-w", "-t", "60"), args...)
	out, err := os.CreateTemp("", "pg_ctl-")
	if err != nil {
		s.t.Logf("pg_ctl %v: %v", args, err)
		return
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		b, _ := os.ReadFile(out.Name())
		s.t.Logf("pg_ctl %v: %v: %s", args, err, b)
	}
}

func (s *pgServer) logFile() string { return filepath.Join(s.dataDir, "log") }
func (s *pgServer) start()          { s.ctl("start", "-l", s.logFile()) }
func (s *pgServer) stop()           { s.ctl("stop", "-m", "fast") }
func (s *pgServer) restart()        { s.ctl("restart", "-m", "fast", "-l", s.logFile()) }

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// Postgres restarted mid-run: the failed batches are retried with backoff
// and the run completes; every ACTIVE subscriber is invoiced exactly once.
// Postgres down longer than the retries: the run is FAILED with last_error,
// and a later run resumes from the committed batches.
func TestPostgresRestartMidRun(t *testing.T) {
	t.Parallel()
	srv := startOwnPostgres(t)
	ctx := context.Background()
	pool, err := postgres.Connect(ctx, srv.dsn, 8)
	require.NoError(t, err)
	defer pool.Close()
	m, err := migrate.New(pool)
	require.NoError(t, err)
	_, err = m.Up(ctx)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	seeded, err := billrun.Seed(ctx, pool, billrun.SeedConfig{Subscribers: 2000, SuspendedRatio: 0.1, Usage: true, Period: period})
	require.NoError(t, err)

	locker := ownership.NewMemoryLocker(ownership.MemoryConfig{Owner: "replica-a"})
	defer locker.Close()
	b := &bundle{pool: pool, locker: locker, rec: &events.Recorder{}}

	t.Run("restart is retried", func(t *testing.T) {
		var n atomic.Int64
		hook := func(ctx context.Context, _, _ int64) error {
			if n.Add(1) == 4 {
				srv.restart() // the other worker's batch breaks meanwhile
			}
			return nil
		}
		res := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 2, MaxBatchAttempts: 8, RetryBackoff: 100 * time.Millisecond}, hook)).
			Run(ctx, period, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Positive(t, res.Counts["batches_retried"], "a batch met the restart")
		require.Equal(t, seeded.Active, res.Counts["invoices_created"])
		b.requireExactlyOnce(t, period)
	})

	t.Run("down too long fails, a later run resumes", func(t *testing.T) {
		p := billrun.Period{Year: 2026, Month: time.December}
		var n atomic.Int64
		restarted := make(chan struct{})
		hook := func(ctx context.Context, _, _ int64) error {
			if n.Add(1) == 4 {
				srv.stop()
				go func() { // back after the batch's retries are spent, before finishTimeout
					defer close(restarted)
					time.Sleep(time.Second) // a fixed outage length, not a wait for a state
					srv.start()
				}()
			}
			return nil
		}
		res := b.runner(billrun.WithBeforeBatch(billrun.Config{BatchSize: 100, Workers: 1, MaxBatchAttempts: 2, RetryBackoff: 50 * time.Millisecond}, hook)).
			Run(ctx, p, trig())
		<-restarted
		require.Equal(t, job.OutcomeFailed, res.Outcome)
		require.Equal(t, int64(3), res.Counts["batches_committed"])
		require.Len(t, b.rec.OfType(events.RunFailed), 1)
		st, err := b.runner(billrun.Config{}).Status(ctx, p)
		require.NoError(t, err)
		require.Equal(t, billrun.StatusFailed, st.Status)
		require.NotEmpty(t, st.LastError) // the batch's or the planner's error, whichever met the outage first
		require.Equal(t, res.Error, st.LastError)

		res = b.runner(billrun.Config{BatchSize: 100, Workers: 2}).Run(ctx, p, trig())
		require.Equal(t, job.OutcomeCompleted, res.Outcome, res.Error)
		require.Equal(t, int64(3), res.Counts["batches_skipped"])
		require.Equal(t, int64(2), res.Fence)
		b.requireExactlyOnce(t, p)
	})
}
