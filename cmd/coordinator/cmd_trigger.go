package main

import (
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/replica"
	"github.com/telco-platform/coordinator/internal/topics"
)

func init() {
	register(command{name: "trigger", summary: "KIND [flags]: produce a kind's trigger record to Kafka", run: runTrigger, ownHelp: true})
}

// produced is what `coordinator trigger` prints: one JSON object per record.
type produced struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Key       string          `json:"key,omitempty"`
	Value     json.RawMessage `json:"value"`
}

// runTrigger produces the record a replica's consumer turns into a run of
// KIND: the kind's flags, encoded as its topic's JSON value, plus the
// envelope (request_id, requested_by).
func runTrigger(ctx context.Context, cio cliIO, args []string) int {
	var requestedBy *string
	c, code := parseKindCall(cio, "trigger", args, "[--requested-by WHO] ", func(fs *flag.FlagSet) {
		requestedBy = fs.String("requested-by", "", "who asks (default: cli:$USER)")
	})
	if code != 0 {
		return code
	}
	reg, k, spec, name, cfg := c.reg, c.kind, c.spec, c.name, c.cfg
	if spec.Topic == "" {
		fmt.Fprintf(cio.stderr, "coordinator %s: kind %q has no Kafka trigger topic\n", name, spec.Name)
		return job.ExitUsage
	}
	key, fields, err := k.Encode(c.params)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return job.ExitFailed
	}
	value := map[string]any{}
	for f, v := range fields {
		value[f] = v
	}
	value["request_id"] = c.requestID
	value["requested_by"] = cmp.Or(*requestedBy, "cli:"+cmp.Or(cio.getenv("USER"), "unknown"))
	names := topics.New(cfg.Kafka.TopicPrefix, reg.Topics()...)
	rec := &kgo.Record{Topic: names.Topic(spec.Topic), Key: key}
	if rec.Value, err = json.Marshal(value); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: encode: %v\n", name, err)
		return job.ExitFailed
	}

	cl, code := kafkaClient(cio, name, cfg, kgo.ProducerLinger(0), kgo.ClientID("coordinator-trigger"))
	if code != 0 {
		return code
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// Like serve: create the deployment's topics when allowed, else name the missing one.
	if err := topics.Ensure(pctx, kadm.NewClient(cl), names, cfg.Kafka.CreateTopics); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, kafkaconn.Classify(err))
		return job.ExitUnavailable
	}
	if err := cl.ProduceSync(pctx, rec).FirstErr(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: produce to %s via %v: %v\n", name, rec.Topic, cfg.Kafka.Brokers, kafkaconn.Classify(err))
		return job.ExitUnavailable
	}
	out, _ := json.Marshal(produced{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key), Value: rec.Value})
	fmt.Fprintln(cio.stdout, string(out))
	return job.ExitOK
}

// kafkaClient builds a CLI command's Kafka client on the configured brokers
// with the configured TLS and SASL (internal/kafkaconn), plus opts. On error
// it prints the reason and returns the exit code. franz-go's warnings and
// errors are log records on stderr; below warn its lines would only bury
// the command's own output, so they are logged from warn up whatever
// COORDINATOR_LOG_LEVEL says.
func kafkaClient(cio cliIO, name string, cfg config.Config, opts ...kgo.Opt) (*kgo.Client, int) {
	lc := cfg
	var level slog.Level
	if err := level.UnmarshalText([]byte(cfg.Log.Level)); err != nil || level < slog.LevelWarn {
		lc.Log.Level = "warn"
	}
	sec, err := kafkaconn.Options(replica.KafkaConn(cfg), newLogger(lc, cio.stderr))
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return nil, job.ExitUsage
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(cfg.Kafka.Brokers...)}, sec...), opts...)...)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: kafka client: %v\n", name, err)
		return nil, job.ExitFailed
	}
	return cl, 0
}
