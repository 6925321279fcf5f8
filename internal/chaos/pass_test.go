package chaos

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Tests that build the binaries and run the verifier for real.

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// binaries builds, once per test binary, the shipped coordinator, the
// chaos_sabotage coordinator and cmd/chaos.
func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "chaos-test-bin-")
		if buildErr != nil {
			return
		}
		for _, b := range []struct{ out, tags, pkg string }{
			{"coordinator", "", "./cmd/coordinator"},
			{"coordinator-chaos", "testhooks", "./cmd/coordinator"},
			{"coordinator-sabotage", "testhooks," + SabotageTag, "./cmd/coordinator"},
			{"chaos", "", "./cmd/chaos"},
		} {
			args := []string{"build", "-o", filepath.Join(buildDir, b.out)}
			if b.tags != "" {
				args = append(args, "-tags", b.tags)
			}
			cmd := exec.Command("go", append(args, b.pkg)...)
			cmd.Dir = RepoRoot(".")
			if out, err := cmd.CombinedOutput(); err != nil {
				buildErr = errors.New("go " + strings.Join(args, " ") + ": " + err.Error() + "\n" + string(out))
				return
			}
		}
	})
	require.NoError(t, buildErr)
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// The shipped build carries no sabotage: its build information has no
// chaos_sabotage tag and its bytes do not hold the sabotaged SQL. The same
// checks on the sabotaged build prove they can fail. The Dockerfile and the
// Makefile's build target never pass the tag.
func TestShippedBuildIsNotSabotaged(t *testing.T) {
	dir := binaries(t)
	for _, c := range []struct {
		bin  string
		want bool
	}{{"coordinator", false}, {"coordinator-chaos", false}, {"coordinator-sabotage", true}} {
		path := filepath.Join(dir, c.bin)
		got, err := IsSabotaged(path)
		require.NoError(t, err)
		require.Equal(t, c.want, got, "%s: build tag %s", c.bin, SabotageTag)
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		require.Equal(t, c.want, bytes.Contains(b, []byte("chaos_sabotage_build")), "%s: sabotaged SQL in the binary", c.bin)
		err = CheckBuild(path, !c.want)
		require.Error(t, err, "the verifier refuses %s in the other mode", c.bin)
	}
	root := RepoRoot(".")
	docker, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	require.NoError(t, err)
	require.NotContains(t, string(docker), SabotageTag)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	for _, line := range strings.Split(string(mk), "\n") {
		if strings.Contains(line, "-o $(BIN) ") {
			require.NotContains(t, line, SabotageTag, "make build: %s", line)
		}
	}
}

// prerequisites skips the test when a program the verifier runs is missing.
func prerequisites(t *testing.T, coordinator string) {
	t.Helper()
	if testing.Short() {
		t.Skip("chaos pass: skipped in -short mode")
	}
	_, err := FindBinaries(Binaries{Coordinator: coordinator}, RepoRoot("."))
	if errors.Is(err, ErrMissing) {
		t.Skipf("chaos pass needs programs that are not installed: %v", err)
	}
	require.NoError(t, err)
}

// runPass runs cmd/chaos as `make chaos` would and returns its exit code,
// its output and the parsed report.json.
func runPass(t *testing.T, env ...string) (int, string, Report) {
	t.Helper()
	dir := binaries(t)
	out := t.TempDir()
	cmd := exec.Command(filepath.Join(dir, "chaos"))
	cmd.Dir = RepoRoot(".")
	cmd.Env = append(append(baseEnv(), "CHAOS_OUT="+out), env...)
	if v := os.Getenv("SERVICES_CACHE_DIR"); v != "" {
		cmd.Env = append(cmd.Env, "SERVICES_CACHE_DIR="+v)
	}
	// The verifier and everything it started die with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	start := time.Now()
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else {
		require.NoError(t, err)
	}
	t.Logf("chaos pass took %s, exit %d:\n%s", time.Since(start).Round(time.Second), code, buf.String())
	var rep Report
	if b, err := os.ReadFile(filepath.Join(out, "report.json")); err == nil {
		require.NoError(t, json.Unmarshal(b, &rep))
		md, err := os.ReadFile(filepath.Join(out, "report.md"))
		require.NoError(t, err)
		require.Contains(t, string(md), "# Chaos report")
	}
	return code, buf.String(), rep
}

// The sabotage pass: against the chaos_sabotage build the verifier must
// report what each of its variants does and exit non-zero: a bill run that
// ignores its lost lease and skips the batch fence check (stale batch
// commits, after a Redis restart with takeovers), a run completed without
// reconciling its invoices with the database (invoices missing, after
// PostgreSQL lost acknowledged commits) and a failed cron tick dropped
// (after a PostgreSQL outage across a tick). The faults are the ones the
// sabotage is blind to; the seed is fixed.
func TestSabotagePassReportsAnomalies(t *testing.T) {
	dir := binaries(t)
	prerequisites(t, filepath.Join(dir, "coordinator-sabotage"))
	code, out, rep := runPass(t,
		"CHAOS_SABOTAGE=1", "CHAOS_COORDINATOR="+filepath.Join(dir, "coordinator-sabotage"),
		"CHAOS_DURATION=65", "CHAOS_RECOVERY=15", "CHAOS_SEED=14",
		"CHAOS_FAULTS="+FaultRedisRestart+","+FaultPGLostCommits+","+FaultPGRestart)
	require.Equal(t, 1, code, "exit code of a pass with anomalies:\n%s", out)
	require.True(t, strings.HasPrefix(out, "chaos: seed 14"), "the seed is printed first")
	require.Equal(t, VerdictAnomalies, rep.Verdict)
	require.EqualValues(t, 14, rep.Seed)
	require.EqualValues(t, 65, rep.DurationS)
	got := kinds(rep.Anomalies)
	require.Contains(t, got, KindStaleBatchCommit,
		"the sabotaged build's stale batch commits are found (a correct build cannot make them)")
	require.Contains(t, got, KindInvoiceMissing,
		"the sabotaged build completes runs over batches PostgreSQL lost (a build that reconciles cannot)")
	require.Contains(t, got, KindCronTickDropped,
		"the sabotaged build drops a cron tick it could neither run nor record (a build that retries it cannot)")
	for _, k := range []string{FaultRedisRestart, FaultPGLostCommits, FaultPGRestart} {
		require.Positive(t, rep.Faults[k], k)
	}
	require.Positive(t, rep.Operations["triggers_accepted"])
}

// The verifier refuses to run the sabotaged build as if it were the product.
func TestVerifierRefusesMismatchedBuild(t *testing.T) {
	dir := binaries(t)
	prerequisites(t, filepath.Join(dir, "coordinator-chaos"))
	code, out, _ := runPass(t, "CHAOS_COORDINATOR="+filepath.Join(dir, "coordinator-sabotage"), "CHAOS_DURATION=10")
	require.Equal(t, 64, code)
	require.Contains(t, out, "is the sabotaged build")
}
