package main

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/telco-platform/coordinator/internal/events"
	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/kafkaconn"
	"github.com/telco-platform/coordinator/internal/replica"
	"github.com/telco-platform/coordinator/internal/topics"
)

func init() {
	register(command{name: "watch", summary: "tail ownership events: one line each (--json, --from-beginning)", run: runWatch, ownHelp: true})
}

// runWatch reads the events topic partition by partition, with no consumer
// group, so any number of watchers see every event and steal none. It ends
// on SIGINT/SIGTERM (ctx), closing the client within a bound.
func runWatch(ctx context.Context, cio cliIO, args []string) int {
	fs := newFlagSet(cio, "watch", "[--json] [--from-beginning] [flags]")
	asJSON := jsonFlag(fs)
	fromStart := fs.Bool("from-beginning", false, "start at the oldest retained event instead of new ones")
	cfg, rest, code := parseConfig(cio, fs, args)
	if code != 0 {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(cio.stderr, "coordinator watch: unexpected arguments %q\n", rest)
		return job.ExitUsage
	}
	topic := topics.New(cfg.Kafka.TopicPrefix).Events
	start := kgo.NewOffset().AtEnd()
	if *fromStart {
		start = kgo.NewOffset().AtStart()
	}
	cl, code := kafkaClient(cio, "watch", cfg, kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(start), kgo.FetchMaxWait(250*time.Millisecond), kgo.ClientID("coordinator-watch"))
	if code != 0 {
		return code
	}
	closed := make(chan struct{})
	defer func() {
		go func() { cl.Close(); close(closed) }()
		select {
		case <-closed:
		case <-time.After(5 * time.Second):
			fmt.Fprintln(cio.stderr, "coordinator watch: client close timed out")
		}
	}()
	// Rejected credentials or certificates end the watch at once (69)
	// instead of a fetch error per poll; a broker that is down is waited for.
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	err := kafkaconn.Check(pctx, cl)
	cancel()
	if kafkaconn.Fatal(err) {
		fmt.Fprintf(cio.stderr, "coordinator watch: %v\n", err)
		return job.ExitUnavailable
	}
	fmt.Fprintf(cio.stderr, "coordinator watch: %s on %s (%s; Ctrl-C to stop)\n", topic, strings.Join(cfg.Kafka.Brokers, ","), kafkaconn.Describe(replica.KafkaConn(cfg)))
	for {
		fetches := cl.PollFetches(ctx)
		if ctx.Err() != nil || fetches.IsClientClosed() {
			return job.ExitOK
		}
		fetches.EachError(func(t string, p int32, err error) {
			fmt.Fprintf(cio.stderr, "coordinator watch: fetch %s/%d: %v\n", t, p, kafkaconn.Classify(err))
		})
		fetches.EachRecord(func(r *kgo.Record) {
			if *asJSON {
				fmt.Fprintln(cio.stdout, string(r.Value))
				return
			}
			fmt.Fprintln(cio.stdout, formatEvent(r.Value))
		})
	}
}

// formatEvent renders one CloudEvent as a readable line: time, type, key,
// replica, owner, fence, trigger, request id, then counts and reasons.
func formatEvent(value []byte) string {
	var ce events.CloudEvent
	if err := json.Unmarshal(value, &ce); err != nil || ce.Type == "" {
		return "unreadable event: " + strings.TrimSpace(string(value))
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-24s %s", ce.Time.Local().Format("15:04:05.000"), ce.Type, ce.Subject)
	named := []string{"replica", "owner", "fence", "trigger", "request_id"}
	for _, k := range named {
		if v, ok := ce.Data[k]; ok && v != "" && v != nil {
			fmt.Fprintf(&b, " %s=%s", k, scalar(v))
		}
	}
	skip := map[string]bool{"key": true, "job": true}
	for _, k := range named {
		skip[k] = true
	}
	var rest []string
	for k := range ce.Data {
		if !skip[k] {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	for _, k := range rest {
		fmt.Fprintf(&b, " %s=%s", k, scalar(ce.Data[k]))
	}
	return b.String()
}

func scalar(v any) string {
	switch x := v.(type) {
	case string:
		if strings.ContainsAny(x, " \t\"=") {
			return fmt.Sprintf("%q", x)
		}
		return x
	case float64:
		if x == float64(int64(x)) {
			return fmt.Sprintf("%d", int64(x))
		}
		return fmt.Sprint(x)
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}
