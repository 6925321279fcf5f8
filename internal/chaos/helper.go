package chaos

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// The critical-section helper: the command a lock worker runs under
// `coordinator lock`. It records, in the verifier's tables, when it started
// believing it held the lock, the fenced rows it appended while it did, and
// when it finished; and it may leave a child running behind it, as careless
// commands do. Exit codes: 0 done, 2 bad environment, 3 database error.

// Environment of the helper (besides the lock's COORDINATOR_LOCK_*).
const (
	EnvHelperDSN = "CHAOS_DSN"
	envLockPID   = "CHAOS_LOCK_PID"
	envLockStart = "CHAOS_LOCK_START"
	envLinger    = "CHAOS_LINGER"
	envRole      = "CHAOS_ROLE"
)

// lingerMax bounds a left-behind child's life, so that nothing the verifier
// caused outlives it for long even if the verifier itself is killed.
const lingerMax = 20 * time.Second

type helperEnv struct {
	key, owner string
	fence      int64
	lockPID    int
	lockStart  uint64
	dsn        string
}

func readHelperEnv() (helperEnv, error) {
	e := helperEnv{key: os.Getenv("COORDINATOR_LOCK_KEY"), owner: os.Getenv("COORDINATOR_LOCK_OWNER"), dsn: os.Getenv(EnvHelperDSN)}
	var err error
	if e.fence, err = strconv.ParseInt(os.Getenv("COORDINATOR_LOCK_FENCE"), 10, 64); err != nil {
		return e, fmt.Errorf("COORDINATOR_LOCK_FENCE = %q: %v", os.Getenv("COORDINATOR_LOCK_FENCE"), err)
	}
	if e.key == "" || e.dsn == "" {
		return e, fmt.Errorf("COORDINATOR_LOCK_KEY and %s are required", EnvHelperDSN)
	}
	return e, nil
}

// Critical runs one critical section (`chaos critical`).
func Critical(args []string) int {
	start := Mono()
	fs := flag.NewFlagSet("critical", flag.ContinueOnError)
	hold := fs.Duration("hold", 200*time.Millisecond, "time inside the section")
	writes := fs.Int("writes", 2, "fenced rows appended, spread over the hold")
	linger := fs.Duration("linger", 0, "leave a child running this long after the section")
	escape := fs.Bool("escape", false, "the child leaves the process group (setsid)")
	stubborn := fs.Bool("stubborn", false, "ignore SIGTERM")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *stubborn {
		signal.Ignore(syscall.SIGTERM)
	}
	e, err := readHelperEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos critical:", err)
		return 2
	}
	e.lockPID = os.Getppid()
	e.lockStart, _ = procStartTime(e.lockPID)
	self, _ := procStartTime(os.Getpid())

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second+*hold)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos critical:", err)
		return 3
	}
	defer conn.Close(context.Background())
	if err := registerProc(ctx, conn, e, os.Getpid(), self, "command", start); err != nil {
		fmt.Fprintln(os.Stderr, "chaos critical:", err)
		return 3
	}
	var id int64
	if err := conn.QueryRow(ctx, `insert into chaos.sections (key, fence, owner, lock_pid, lock_start, pid, start_ns)
values ($1, $2, $3, $4, $5, $6, $7) returning id`, e.key, e.fence, e.owner, e.lockPID, int64(e.lockStart), os.Getpid(), start).Scan(&id); err != nil {
		fmt.Fprintln(os.Stderr, "chaos critical:", err)
		return 3
	}
	n := max(*writes, 1)
	for i := 0; i < n; i++ {
		time.Sleep(*hold / time.Duration(n))
		if err := appendWrite(ctx, conn, e, "section"); err != nil {
			fmt.Fprintln(os.Stderr, "chaos critical:", err)
			return 3
		}
	}
	if *linger > 0 {
		if err := spawnLinger(e, *linger, *escape); err != nil {
			fmt.Fprintln(os.Stderr, "chaos critical: linger:", err)
		}
	}
	end := Mono()
	if _, err := conn.Exec(ctx, `update chaos.sections set end_ns = $2 where id = $1`, id, end); err != nil {
		fmt.Fprintln(os.Stderr, "chaos critical:", err)
		return 3
	}
	_, _ = conn.Exec(ctx, `update chaos.procs set ended_ns = $3 where pid = $1 and start_time = $2`, os.Getpid(), int64(self), end)
	return 0
}

func spawnLinger(e helperEnv, d time.Duration, escape bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	role := "linger"
	if escape {
		role = "escaped"
	}
	cmd := exec.Command(self, "linger")
	cmd.Env = append(os.Environ(),
		envLockPID+"="+strconv.Itoa(e.lockPID),
		envLockStart+"="+strconv.FormatUint(e.lockStart, 10),
		envLinger+"="+d.String(),
		envRole+"="+role)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: escape}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// Linger is the child a section leaves behind (`chaos linger`): it lives a
// while, then appends one "late" row under the fence its parent had.
func Linger() int {
	start := Mono()
	time.AfterFunc(lingerMax, func() { os.Exit(4) })
	e, err := readHelperEnv()
	if err != nil {
		return 2
	}
	e.lockPID, _ = strconv.Atoi(os.Getenv(envLockPID))
	e.lockStart, _ = strconv.ParseUint(os.Getenv(envLockStart), 10, 64)
	d, _ := time.ParseDuration(os.Getenv(envLinger))
	self, _ := procStartTime(os.Getpid())
	ctx, cancel := context.WithTimeout(context.Background(), lingerMax)
	defer cancel()
	conn, err := pgx.Connect(ctx, e.dsn)
	if err != nil {
		return 3
	}
	defer conn.Close(context.Background())
	if err := registerProc(ctx, conn, e, os.Getpid(), self, os.Getenv(envRole), start); err != nil {
		return 3
	}
	time.Sleep(min(d, lingerMax/2))
	if err := appendWrite(ctx, conn, e, "late"); err != nil {
		return 3
	}
	_, _ = conn.Exec(ctx, `update chaos.procs set ended_ns = $3 where pid = $1 and start_time = $2`, os.Getpid(), int64(self), Mono())
	return 0
}

func registerProc(ctx context.Context, conn *pgx.Conn, e helperEnv, pid int, start uint64, role string, startNS int64) error {
	_, err := conn.Exec(ctx, `insert into chaos.procs (pid, start_time, lock_pid, lock_start, role, key, fence, started_ns)
values ($1, $2, $3, $4, $5, $6, $7, $8)`, pid, int64(start), e.lockPID, int64(e.lockStart), role, e.key, e.fence, startNS)
	return err
}

// appendWrite appends one fenced row. The advisory lock serialises the
// writes of one key, so row ids are their commit order.
func appendWrite(ctx context.Context, conn *pgx.Conn, e helperEnv, role string) error {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }() // after Commit, a no-op
	if _, err := tx.Exec(ctx, `select pg_advisory_xact_lock(hashtext('chaos.writes:' || $1))`, e.key); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `insert into chaos.writes (key, fence, lock_pid, lock_start, pid, role, mono_ns)
values ($1, $2, $3, $4, $5, $6, $7)`, e.key, e.fence, e.lockPID, int64(e.lockStart), os.Getpid(), role, Mono()); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
