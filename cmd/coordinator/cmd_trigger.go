package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/topics"
)

func init() {
	register(command{name: "trigger", summary: "billrun --period P | reaper: produce a trigger message to Kafka", run: runTrigger})
}

// produced is what `coordinator trigger` prints: one JSON object per record.
type produced struct {
	Topic     string          `json:"topic"`
	Partition int32           `json:"partition"`
	Offset    int64           `json:"offset"`
	Key       string          `json:"key,omitempty"`
	Value     json.RawMessage `json:"value"`
}

func runTrigger(ctx context.Context, cio cliIO, args []string) int {
	if len(args) == 0 || (args[0] != "billrun" && args[0] != "reaper") {
		fmt.Fprintln(cio.stderr, "usage: coordinator trigger billrun --period YYYY-MM [--request-id ID] [--requested-by WHO]")
		fmt.Fprintln(cio.stderr, "       coordinator trigger reaper [--request-id ID] [--requested-by WHO]")
		return job.ExitUsage
	}
	kind := args[0]
	fs := newFlagSet(cio, "trigger "+kind)
	period := ""
	if kind == "billrun" {
		fs.StringVar(&period, "period", "", "billing period YYYY-MM (required)")
	}
	requestID := fs.String("request-id", "", "request id (default: random)")
	requestedBy := fs.String("requested-by", "", "who asks (default: cli:$USER)")
	cfg, rest, code := parseConfig(cio, fs, args[1:])
	if code != 0 {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator trigger %s: unexpected arguments %q\n", kind, rest)
		return job.ExitUsage
	}
	names := topics.New(cfg.KafkaTopicPrefix)
	value := map[string]string{"request_id": *requestID, "requested_by": *requestedBy}
	if value["request_id"] == "" {
		value["request_id"] = events.NewID()
	}
	if value["requested_by"] == "" {
		value["requested_by"] = "cli:" + cmp.Or(cio.getenv("USER"), "unknown")
	}
	rec := &kgo.Record{Topic: names.ReaperRequested}
	if kind == "billrun" {
		if period == "" {
			fmt.Fprintln(cio.stderr, "coordinator trigger billrun: --period is required (YYYY-MM, e.g. 2026-11)")
			return job.ExitUsage
		}
		p, err := billrun.ParsePeriod(period)
		if err != nil {
			fmt.Fprintf(cio.stderr, "coordinator trigger billrun: %v\n", err)
			return job.ExitUsage
		}
		value["period"] = p.String()
		rec = &kgo.Record{Topic: names.BillrunRequested, Key: []byte(p.String())}
	}
	var err error
	if rec.Value, err = json.Marshal(value); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator trigger: encode: %v\n", err)
		return job.ExitFailed
	}

	cl, code := kafkaClient(cio, "trigger", cfg, kgo.ProducerLinger(0), kgo.ClientID("coordinator-trigger"))
	if code != 0 {
		return code
	}
	defer cl.Close()
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	// Like serve: create the contract's topics when allowed, else name the missing one.
	if err := topics.Ensure(pctx, kadm.NewClient(cl), names, cfg.KafkaCreateTopics); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator trigger: %v\n", kafkaconn.Classify(err))
		return job.ExitUnavailable
	}
	if err := cl.ProduceSync(pctx, rec).FirstErr(); err != nil {
		fmt.Fprintf(cio.stderr, "coordinator trigger: produce to %s via %v: %v\n", rec.Topic, cfg.KafkaBrokers, kafkaconn.Classify(err))
		return job.ExitUnavailable
	}
	out, _ := json.Marshal(produced{Topic: rec.Topic, Partition: rec.Partition, Offset: rec.Offset, Key: string(rec.Key), Value: rec.Value})
	fmt.Fprintln(cio.stdout, string(out))
	return job.ExitOK
}

// kafkaClient builds a CLI command's Kafka client on the configured brokers
// with the configured TLS and SASL (internal/kafkaconn), plus opts. On error
// it prints the reason and returns the exit code.
func kafkaClient(cio cliIO, name string, cfg config.Config, opts ...kgo.Opt) (*kgo.Client, int) {
	sec, err := kafkaconn.Options(cfg)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: %v\n", name, err)
		return nil, job.ExitUsage
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{kgo.SeedBrokers(cfg.KafkaBrokers...)}, sec...), opts...)...)
	if err != nil {
		fmt.Fprintf(cio.stderr, "coordinator %s: kafka client: %v\n", name, err)
		return nil, job.ExitFailed
	}
	return cl, 0
}
