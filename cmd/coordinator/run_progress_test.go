package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/testenv"
)

// progressPeriod is a closed month (two before the current one, UTC).
var progressPeriod = billrun.PeriodOf(time.Now().UTC()).Previous().Previous().String()

func billrunEnv(t *testing.T, batch string) map[string]string {
	t.Helper()
	pg, rd := testenv.Postgres(t), testenv.Redis(t)
	env := map[string]string{"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL,
		"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_BILLRUN_BATCH_SIZE": batch, "COORDINATOR_REPLICA_ID": "cli"}
	code, _, errs := runCLI(t, env, "seed", "--subscribers", "200")
	require.Equal(t, 0, code, errs)
	return env
}

func cliCommand(bin string, env map[string]string, args ...string) *exec.Cmd {
	cmd := exec.Command(bin, args...)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	return cmd
}

// On a terminal, `coordinator run` draws a live bar on stderr instead of
// progress records; the result stays alone on stdout.
func TestRunShowsAProgressBarOnATerminal(t *testing.T) {
	t.Parallel()
	env := billrunEnv(t, "20")
	env["COORDINATOR_PROGRESS_INTERVAL"] = "100ms"
	master, slavePath := openPTY(t)
	slave, err := os.OpenFile(slavePath, os.O_RDWR, 0)
	require.NoError(t, err)
	out := readPTY(master)
	var stdout bytes.Buffer
	cmd := cliCommand(coordinatorBinary(t), env, "run", "billrun", "--period", progressPeriod)
	cmd.Stderr, cmd.Stdout = slave, &stdout
	require.NoError(t, cmd.Run())
	_ = slave.Close()
	var res job.Result
	require.NoError(t, json.Unmarshal(stdout.Bytes(), &res), stdout.String())
	require.Equal(t, job.OutcomeCompleted, res.Outcome)

	out.waitFor(t, "billrun:"+progressPeriod+" ["+strings.Repeat("#", 30)+"] 100.0% 10/10 batches")
	screen := out.String()
	require.Contains(t, screen, "\r\x1b[K", "the bar is redrawn in place")
	require.Contains(t, screen, `"type":"run.completed"`, "events still show, above the bar")
	require.NotContains(t, screen, owned.ProgressMessage("billrun"), "the bar instead of the records")
	require.NotContains(t, stdout.String(), "\x1b", "nothing but the result on stdout")
}

// Off a terminal there is no bar: the billrun_progress records, every
// COORDINATOR_PROGRESS_INTERVAL.
func TestRunLogsProgressOffATerminal(t *testing.T) {
	t.Parallel()
	env := billrunEnv(t, "20")
	env["COORDINATOR_PROGRESS_INTERVAL"] = "100ms"
	env["COORDINATOR_LOG_FORMAT"] = "json"
	env[envTestBatchDelay] = "60ms" // 10 batches: the run outlasts a few intervals
	var stdout, stderr bytes.Buffer
	cmd := cliCommand(testenv.CoordinatorBinary(t), env, "run", "billrun", "--period", progressPeriod, "--request-id", "p-1")
	cmd.Stderr, cmd.Stdout = &stderr, &stdout
	require.NoError(t, cmd.Run(), stderr.String())
	require.NotContains(t, stderr.String(), "\x1b", "no bar off a terminal")
	var progress []map[string]any
	for _, line := range strings.Split(stderr.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "billrun_progress" {
			progress = append(progress, m)
		}
	}
	require.NotEmpty(t, progress, stderr.String())
	last := progress[len(progress)-1]
	require.Equal(t, float64(10), last["batches_total"])
	require.Equal(t, "p-1", last["request_id"])
	for _, k := range []string{"batches_committed", "percent", "rows_per_s", "eta_s"} {
		require.Contains(t, last, k)
	}
}

// A tracing variable the SDK cannot use stops start-up naming it (64).
func TestBadTracingVariableExits64(t *testing.T) {
	t.Parallel()
	env := map[string]string{"COORDINATOR_DATABASE_URL": "postgres://127.0.0.1:1/none", "OTEL_TRACES_EXPORTER": "otlp",
		"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}
	for _, args := range [][]string{{"serve"}, {"run", "billrun", "--period", progressPeriod}} {
		var stdout, stderr bytes.Buffer
		cmd := cliCommand(coordinatorBinary(t), env, args...)
		cmd.Stderr, cmd.Stdout = &stderr, &stdout
		err := cmd.Run()
		var ee *exec.ExitError
		require.ErrorAs(t, err, &ee, "%v", args)
		require.Equal(t, job.ExitUsage, ee.ExitCode(), "%v: %s", args, stderr.String())
		require.Contains(t, stderr.String(), "OTEL_EXPORTER_OTLP_PROTOCOL", "%v", args)
	}
	env["OTEL_TRACES_EXPORTER"] = "console"
	var stderr bytes.Buffer
	cmd := cliCommand(coordinatorBinary(t), env, "run", "billrun", "--period", progressPeriod)
	cmd.Stderr = &stderr
	var ee *exec.ExitError
	require.ErrorAs(t, cmd.Run(), &ee)
	require.Equal(t, job.ExitUsage, ee.ExitCode(), stderr.String())
	require.Contains(t, stderr.String(), "stdout")
}
