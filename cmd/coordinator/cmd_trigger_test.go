package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/eventsink"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kinds"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

func kafkaCLI(t *testing.T) (map[string]string, topics.Names) {
	t.Helper()
	k := testenv.Kafka(t)
	env := map[string]string{"COORDINATOR_KAFKA_BROKERS": strings.Join(k.Brokers, ","), "COORDINATOR_KAFKA_TOPIC_PREFIX": k.Suffix}
	reg, err := kinds.Config{}.Registry()
	require.NoError(t, err)
	names := topics.New(k.Suffix, reg.Topics()...)
	t.Cleanup(func() {
		adm, err := topics.Dial(k.Brokers)
		if err != nil {
			return
		}
		defer adm.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = adm.DeleteTopics(ctx, names.All()...)
	})
	return env, names
}

func TestTriggerBadPeriodExits64(t *testing.T) {
	t.Parallel()
	var out, errb testenv.Buffer
	code := dispatch(context.Background(), cliIO{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }},
		[]string{"trigger", "billrun", "--period", "2026-13"})
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errb.String(), `period "2026-13"`)
	code = dispatch(context.Background(), cliIO{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }},
		[]string{"trigger", "billrun"})
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errb.String(), "rejected (missing_period): period is required")
	require.Empty(t, out.String())
}

func TestTriggerProducesAndWatchPrintsEvents(t *testing.T) {
	t.Parallel()
	env, names := kafkaCLI(t)
	cio := func(out, errb *testenv.Buffer) cliIO {
		return cliIO{stdout: out, stderr: errb, getenv: func(k string) string { return env[k] }}
	}

	var out, errb testenv.Buffer
	code := dispatch(context.Background(), cio(&out, &errb), []string{"trigger", "billrun", "--period", "2026-11", "--request-id", "cli-1"})
	require.Equal(t, 0, code, errb.String())
	var p produced
	require.NoError(t, json.Unmarshal([]byte(out.String()), &p))
	require.Equal(t, names.Topic(billrun.Topic), p.Topic)
	require.Equal(t, "2026-11", p.Key)
	require.JSONEq(t, `{"period":"2026-11","request_id":"cli-1","requested_by":"cli:unknown"}`, string(p.Value))

	// An event on the events topic, as a replica would publish it.
	sink, err := eventsink.New(eventsink.Config{Brokers: strings.Split(env["COORDINATOR_KAFKA_BROKERS"], ","), Topic: names.Events})
	require.NoError(t, err)
	require.NoError(t, sink.Start(context.Background()))
	sink.Emit(context.Background(), events.Event{Type: events.OwnershipAlreadyOwned, Key: "billrun:2026-11", Job: "billrun",
		Replica: "r2", Owner: "r1", Trigger: "kafka", RequestID: "cli-1", Extra: map[string]any{"reason": "already_owned"}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	require.NoError(t, sink.Flush(ctx))
	cancel()
	sink.Stop()

	for _, asJSON := range []bool{false, true} {
		var wout, werr testenv.Buffer
		args := []string{"watch", "--from-beginning"}
		if asJSON {
			args = append(args, "--json")
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan int, 1)
		go func() { done <- dispatch(ctx, cio(&wout, &werr), args) }()
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			require.Contains(c, wout.String(), "\n", "watch printed nothing: %s", werr.String())
		}, 30*time.Second, 20*time.Millisecond)
		cancel() // SIGINT
		select {
		case code := <-done:
			require.Equal(t, 0, code)
		case <-time.After(10 * time.Second):
			t.Fatal("watch did not stop on cancel")
		}
		line := strings.TrimSpace(wout.String())
		if asJSON {
			var ce events.CloudEvent
			require.NoError(t, json.Unmarshal([]byte(line), &ce))
			require.Equal(t, events.OwnershipAlreadyOwned, ce.Type)
			continue
		}
		require.Contains(t, line, "ownership.already_owned")
		require.Contains(t, line, "billrun:2026-11")
		require.Contains(t, line, "replica=r2")
		require.Contains(t, line, "owner=r1")
		require.Contains(t, line, "reason=already_owned")
	}
}

// -h exits 0 on every command, `run` and `trigger` with or without a kind.
func TestHelpExitsZeroEverywhere(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-h"}, {"--help"}, {"help"}, {"run", "-h"}, {"trigger", "--help"}, {"run", "billrun", "-h"},
		{"trigger", "reaper", "-h"}, {"serve", "-h"}, {"migrate", "-h"}, {"migrate", "status", "-h"},
		{"locks", "-h"}, {"watch", "-h"}, {"seed", "-h"}, {"version", "-h"}, {"lock", "-h"},
		{"lock", "--key", "k", "--help"},
	} {
		code, out, errs := runCLI(t, map[string]string{}, args...)
		require.Equal(t, 0, code, "%v: %s", args, errs)
		require.Contains(t, out, "usage: coordinator", args)
	}
	code, out, _ := runCLI(t, map[string]string{}, "run", "billrun", "-h")
	require.Equal(t, 0, code)
	require.Contains(t, out, "-period string")
	require.Contains(t, out, "-lock-wait-time duration")
	require.Contains(t, out, "(default 5s)", "typed flags show their defaults")
	require.Less(t, strings.Index(out, "-period"), strings.Index(out, "configuration flags"), "the command's own flags come first")
	code, out, _ = runCLI(t, map[string]string{}, "--version")
	require.Equal(t, 0, code)
	require.True(t, strings.HasPrefix(out, "coordinator "), out)
	code, out2, _ := runCLI(t, map[string]string{}, "version")
	require.Equal(t, 0, code)
	require.Equal(t, out, out2)
	code, _, errs := runCLI(t, map[string]string{}, "run", "nope")
	require.Equal(t, job.ExitUsage, code)
	require.Contains(t, errs, `unknown kind "nope"`)
}

// Integer flags are base 10 only: `--count 010` added 8 numbers (Go's
// flag.Int64 reads a leading zero as octal), `--workers 010` ran 8 workers,
// `0x10` was 16. Each is refused with exit 64 naming the flag, before
// anything is contacted.
func TestIntegerFlagsRefuseOtherBases(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"run", "replenish", "--first", "447200000000", "--count", "010"},
		{"trigger", "replenish", "--first", "447200000000", "--count", "0x10"},
		{"run", "reaper", "--workers", "010"},
		{"run", "reaper", "--workers", "0b11"},
		{"seed", "--subscribers", "010"},
		{"run", "billrun", "--period", "2026-01", "--billrun-workers", "010"},
	} {
		var out, errb testenv.Buffer
		code := dispatch(context.Background(), cliIO{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}, args)
		require.Equal(t, job.ExitUsage, code, "%v: %s", args, errb.String())
		flagName := args[len(args)-2]
		require.Contains(t, errb.String(), flagName[1:], "%v names the flag: %s", args, errb.String())
		require.Empty(t, out.String(), "%v", args)
	}
}

// The commands read the configuration with the environment's own lookup,
// so COORDINATOR_REAPER_SCHEDULE="" is off, not the default.
func TestAnEmptyVariableReachesTheConfiguration(t *testing.T) {
	t.Parallel()
	env := map[string]string{"COORDINATOR_REAPER_SCHEDULE": ""}
	var out, errb testenv.Buffer
	cio := cliIO{stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] },
		lookupEnv: func(k string) (string, bool) { v, ok := env[k]; return v, ok }}
	cfg, _, code := loadConfig(cio, "serve", nil)
	require.Zero(t, code, errb.String())
	require.Empty(t, cfg.Reaper.Schedule)
	cio.lookupEnv = nil
	cfg, _, code = loadConfig(cio, "serve", nil)
	require.Zero(t, code, errb.String())
	require.Equal(t, "@every 30s", cfg.Reaper.Schedule, "without a lookup an empty variable is unset")
}
