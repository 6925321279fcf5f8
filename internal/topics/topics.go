// Package topics names the contract's Kafka topics (docs/contract.md), applies the
// deployment's topic prefix, and makes sure the topics exist: Ensure creates
// the missing ones when allowed, Check is the readiness probe that names
// every missing topic.
package topics

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The contract's own topic names, before any prefix. Trigger topics belong
// to the kinds (owned.Spec.Topic) and are passed to New.
const (
	DLQ    = "coordinator.triggers.dlq"
	Events = "coordinator.ownership.events"
)

// Names are the topic names one deployment uses.
type Names struct {
	// DLQ and Events are the prefixed contract topics.
	DLQ    string
	Events string

	prefix   string
	triggers []string
}

// New returns the deployment's names: the contract topics and the given
// trigger topics (contract names, usually owned.Registry.Topics()), each
// with prefix prepended. An empty prefix gives the contract names
// unchanged; otherwise prefix and name are joined with a dot unless the
// prefix already ends in '.', '_' or '-' ("t_ab12" ->
// "t_ab12.billing.billrun.requested").
func New(prefix string, triggerTopics ...string) Names {
	p := prefix
	if p != "" && !strings.HasSuffix(p, ".") && !strings.HasSuffix(p, "_") && !strings.HasSuffix(p, "-") {
		p += "."
	}
	n := Names{DLQ: p + DLQ, Events: p + Events, prefix: p}
	for _, t := range triggerTopics {
		n.triggers = append(n.triggers, p+t)
	}
	return n
}

// IsZero reports whether n is the zero Names (no New yet).
func (n Names) IsZero() bool { return n.DLQ == "" && n.Events == "" }

// Topic is a contract topic name with the deployment's prefix.
func (n Names) Topic(name string) string { return n.prefix + name }

// Triggers are the trigger topics, prefixed, in the order given to New.
func (n Names) Triggers() []string { return append([]string(nil), n.triggers...) }

// All lists every topic of the deployment.
func (n Names) All() []string {
	return append(n.Triggers(), n.DLQ, n.Events)
}

// Partitions is how many partitions Ensure gives a topic it creates. Trigger
// topics get several so replicas share the consumer group's work; the DLQ is
// an audit trail and needs no parallelism.
func (n Names) Partitions(topic string) int32 {
	switch topic {
	case n.DLQ:
		return 1
	default:
		return 3
	}
}

// MissingError names the topics that do not exist.
type MissingError struct {
	Topics []string
}

func (e *MissingError) Error() string {
	return fmt.Sprintf("topics: missing Kafka topic(s) %s (create them, or set COORDINATOR_KAFKA_CREATE_TOPICS=true)",
		strings.Join(e.Topics, ", "))
}

// ErrMissing matches a *MissingError.
var ErrMissing = errors.New("topics: missing")

func (e *MissingError) Is(target error) bool { return target == ErrMissing }

// Dial returns an admin client on brokers; Close it when done.
func Dial(brokers []string, opts ...kgo.Opt) (*kadm.Client, error) {
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("topics: kafka client: %w", err)
	}
	return kadm.NewClient(cl), nil
}

// Missing returns the deployment's topics that do not exist, sorted.
func Missing(ctx context.Context, adm *kadm.Client, names Names) ([]string, error) {
	all := names.All()
	details, err := adm.ListTopics(ctx, all...)
	if err != nil {
		return nil, fmt.Errorf("topics: list %s: %w", strings.Join(all, ", "), err)
	}
	var missing []string
	for _, t := range all {
		d, ok := details[t]
		switch {
		case !ok, errors.Is(d.Err, kerr.UnknownTopicOrPartition), d.Err == nil && len(d.Partitions) == 0:
			missing = append(missing, t)
		case d.Err != nil:
			return nil, fmt.Errorf("topics: describe %s: %w", t, d.Err)
		}
	}
	sort.Strings(missing)
	return missing, nil
}

// Check is the readiness probe: nil when every topic exists, a *MissingError
// naming each missing topic, or the error that kept the check from running.
func Check(ctx context.Context, adm *kadm.Client, names Names) error {
	missing, err := Missing(ctx, adm, names)
	if err != nil {
		return err
	}
	if len(missing) > 0 {
		return &MissingError{Topics: missing}
	}
	return nil
}

// Ensure makes sure every topic exists. With create, the missing ones are
// created (broker-default replication; a topic another replica created
// first counts as created); without it, a *MissingError names them.
func Ensure(ctx context.Context, adm *kadm.Client, names Names, create bool) error {
	missing, err := Missing(ctx, adm, names)
	if err != nil {
		return err
	}
	if len(missing) == 0 {
		return nil
	}
	if !create {
		return &MissingError{Topics: missing}
	}
	var errs []error
	for _, t := range missing {
		resp, err := adm.CreateTopics(ctx, names.Partitions(t), -1, nil, t)
		if err != nil {
			errs = append(errs, fmt.Errorf("topics: create %s: %w", t, err))
			continue
		}
		r, err := resp.On(t, nil)
		if err == nil {
			err = r.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			errs = append(errs, fmt.Errorf("topics: create %s: %w", t, err))
		}
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	// Metadata reaches every broker shortly after creation; wait until the
	// topics are listed so consumers and producers started next see them.
	ctx, cancel := context.WithTimeout(ctx, visibleTimeout)
	defer cancel()
	for {
		missing, err := Missing(ctx, adm, names)
		if err == nil && len(missing) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			if err == nil {
				err = &MissingError{Topics: missing}
			}
			return fmt.Errorf("topics: created but not yet visible: %w", err)
		}
		waitBriefly(ctx)
	}
}

// visibleTimeout bounds how long Ensure waits for created topics to show.
const visibleTimeout = 15 * time.Second

// waitBriefly pauses between metadata polls, or until ctx ends.
func waitBriefly(ctx context.Context) {
	t := time.NewTimer(100 * time.Millisecond)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
