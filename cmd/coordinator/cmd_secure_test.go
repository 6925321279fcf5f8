package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/testenv"
	"github.com/telco-platform/coordinator/internal/topics"
)

// secureKafkaCLI is kafkaCLI on the SASL_SSL listener: the commands under
// test see only the secure brokers (a client without TLS and SASL fails
// there), while the test checks their records over the PLAINTEXT listener
// of the same broker.
func secureKafkaCLI(t *testing.T) (env map[string]string, names topics.Names, plainBrokers []string, password string) {
	t.Helper()
	sk := testenv.KafkaSecure(t)
	env, names = kafkaCLI(t)
	plainBrokers = strings.Split(env["COORDINATOR_KAFKA_BROKERS"], ",")
	env["COORDINATOR_KAFKA_BROKERS"] = strings.Join(sk.Brokers, ",")
	env["COORDINATOR_KAFKA_TLS_CA_FILE"] = sk.CAFile
	env["COORDINATOR_KAFKA_SASL_MECHANISM"] = "SCRAM-SHA-512"
	env["COORDINATOR_KAFKA_SASL_USERNAME"] = sk.Username
	env["COORDINATOR_KAFKA_SASL_PASSWORD_FILE"] = sk.PasswordFile
	return env, names, plainBrokers, sk.Password(t)
}

// waitForEvent reads topic over plaintext until an event of type typ for key
// arrives (30s bound).
func waitForEvent(t *testing.T, brokers []string, topic string, typ events.Type, key string) events.CloudEvent {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.FetchMaxWait(100*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "no %s event for %s on %s", typ, key, topic)
		var found *events.CloudEvent
		fs.EachRecord(func(r *kgo.Record) {
			var ce events.CloudEvent
			if json.Unmarshal(r.Value, &ce) == nil && ce.Type == typ && ce.Subject == key && found == nil {
				found = &ce
			}
		})
		if found != nil {
			return *found
		}
	}
}

func TestTriggerAndWatchOverSASLSSL(t *testing.T) {
	t.Parallel()
	env, names, plain, _ := secureKafkaCLI(t)
	code, out, errs := runCLI(t, env, "trigger", "billrun", "--period", "2026-11", "--request-id", "secure-1")
	require.Equal(t, 0, code, errs)
	var p produced
	require.NoError(t, json.Unmarshal([]byte(out), &p), out)
	recs := testenv.ReadRecords(t, plain, names.Topic(billrun.Topic), 1)
	require.Contains(t, string(recs[0].Value), `"request_id":"secure-1"`)

	// watch over SASL_SSL prints an event written over plaintext.
	cl, err := kgo.NewClient(kgo.SeedBrokers(plain...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	value, err := json.Marshal(events.Event{Type: events.OwnershipAcquired, Key: "billrun:2026-11", Job: "billrun",
		Replica: "r1", Trigger: "kafka", RequestID: "secure-1"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(ctx, &kgo.Record{Topic: names.Events, Key: []byte("billrun:2026-11"), Value: value}).FirstErr())

	var wout, werr testenv.Buffer
	wctx, stop := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- dispatch(wctx, cliIO{stdout: &wout, stderr: &werr, getenv: func(k string) string { return env[k] }},
			[]string{"watch", "--from-beginning"})
	}()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(wout.String(), "ownership.acquired") {
		require.True(t, time.Now().Before(deadline), "watch printed nothing: %s", werr.String())
		<-time.After(20 * time.Millisecond)
	}
	stop()
	require.Equal(t, 0, <-done)
	require.Contains(t, werr.String(), "sasl_ssl/SCRAM-SHA-512 user=")
}

func TestWrongKafkaPasswordExits69WithoutThePassword(t *testing.T) {
	t.Parallel()
	env, _, _, password := secureKafkaCLI(t)
	delete(env, "COORDINATOR_KAFKA_SASL_PASSWORD_FILE")
	env["COORDINATOR_KAFKA_SASL_PASSWORD"] = "not-the-Hunter2-password"
	check := func(errs string) {
		t.Helper()
		require.Contains(t, errs, "rejected the SASL credentials")
		require.Contains(t, errs, "COORDINATOR_KAFKA_SASL_PASSWORD")
		require.NotContains(t, errs, "Hunter2")
		require.NotContains(t, errs, password)
	}
	t.Run("trigger", func(t *testing.T) {
		t.Parallel()
		code, _, errs := runCLI(t, env, "trigger", "reaper")
		require.Equal(t, job.ExitUnavailable, code, errs)
		check(errs)
	})
	t.Run("watch", func(t *testing.T) {
		t.Parallel()
		code, _, errs := runCLI(t, env, "watch")
		require.Equal(t, job.ExitUnavailable, code, errs)
		check(errs)
	})
	t.Run("serve", func(t *testing.T) {
		t.Parallel()
		pg, rd := testenv.Postgres(t), testenv.Redis(t)
		senv := map[string]string{"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL,
			"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_HTTP_ADDR": "127.0.0.1:0", "COORDINATOR_REPLICA_ID": "secure-serve"}
		for k, v := range env {
			senv[k] = v
		}
		// A bound on "fails fast": well under the start-up step's 15s.
		ctx, cancel := context.WithTimeout(context.Background(), 12*time.Second)
		defer cancel()
		var out, errb testenv.Buffer
		code := dispatch(ctx, cliIO{stdout: &out, stderr: &errb, getenv: func(k string) string { return senv[k] }}, []string{"serve"})
		require.NoError(t, ctx.Err(), "serve kept retrying: %s", errb.String())
		require.Equal(t, job.ExitUnavailable, code, errb.String())
		check(errb.String())
	})
}

// TestServeOverSASLSSL runs a replica whose only brokers are the SASL_SSL
// listener: the trigger consumer, the DLQ producer, the event sink and the
// topic admin all have to dial with TLS and SCRAM for this to pass.
func TestServeOverSASLSSL(t *testing.T) {
	t.Parallel()
	env, names, plain, _ := secureKafkaCLI(t)
	pg, rd := testenv.Postgres(t), testenv.Redis(t)
	for k, v := range map[string]string{"COORDINATOR_DATABASE_URL": pg.DSN, "COORDINATOR_LOCK_REDIS_URL": rd.URL,
		"COORDINATOR_LOCK_KEY_PREFIX": rd.Prefix, "COORDINATOR_HTTP_ADDR": "127.0.0.1:0", "COORDINATOR_REPLICA_ID": "secure-replica",
		"COORDINATOR_REAPER_SCHEDULE": "", "COORDINATOR_SHUTDOWN_TIMEOUT": "5s", "COORDINATOR_KAFKA_GROUP": names.Events + ".group",
		"COORDINATOR_KAFKA_SESSION_TIMEOUT": "6s", "COORDINATOR_LOCK_WATCHDOG_TIMEOUT": "3s", "COORDINATOR_LOCK_WAIT_TIME": "1s"} {
		env[k] = v
	}
	ctx, stop := context.WithCancel(context.Background())
	var out, errb testenv.Buffer
	done := make(chan int, 1)
	go func() {
		done <- dispatch(ctx, cliIO{stdout: &out, stderr: &errb, getenv: func(k string) string { return env[k] }}, []string{"serve"})
	}()
	t.Cleanup(func() {
		stop()
		select {
		case code := <-done:
			require.Equal(t, 0, code, errb.String())
		case <-time.After(30 * time.Second):
			t.Error("serve did not stop")
		}
	})

	// A trigger through `coordinator trigger` over SASL_SSL: the consumer
	// runs it and the sink publishes the outcome.
	code, _, errs := runCLI(t, env, "trigger", "billrun", "--period", "2026-10", "--request-id", "secure-run")
	require.Equal(t, 0, code, errs)
	ce := waitForEvent(t, plain, names.Events, events.RunCompleted, "billrun:2026-10")
	require.Equal(t, "secure-run", ce.Data["request_id"])

	// A malformed trigger goes to the DLQ through the consumer's producer.
	cl, err := kgo.NewClient(kgo.SeedBrokers(plain...), kgo.ProducerLinger(0))
	require.NoError(t, err)
	defer cl.Close()
	pctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, cl.ProduceSync(pctx, &kgo.Record{Topic: names.Topic(billrun.Topic), Key: []byte("x"), Value: []byte("{not json")}).FirstErr())
	dlq := testenv.ReadRecords(t, plain, names.DLQ, 1)
	require.Equal(t, "{not json", string(dlq[0].Value))
	require.Contains(t, errb.String(), "kafka_transport=\"sasl_ssl/SCRAM-SHA-512 user=")
}
