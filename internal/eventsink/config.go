package eventsink

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Config configures the Kafka sink.
type Config struct {
	// Brokers are the seed brokers. Required.
	Brokers []string
	// Topic is the events topic (topics.Names.Events). Required.
	Topic string
	// BufferSize bounds the events waiting to be published (buffered plus in
	// flight). Default 10000.
	BufferSize int
	// MaxInFlight bounds the events handed to the Kafka client at once.
	// Default 512, at most a quarter of BufferSize.
	MaxInFlight int
	// Linger is how long the producer waits to batch records. Default 2ms.
	Linger time.Duration
	// StopTimeout bounds the flush Stop does. Default 5s.
	StopTimeout time.Duration
	// Log receives drops and publish errors (rate-limited). Default: discard.
	Log *slog.Logger
	// Metrics may be nil.
	Metrics *Metrics
	// ClientOpts are extra franz-go options (client id, TLS, SASL).
	ClientOpts []kgo.Opt
}

func (c Config) withDefaults() Config {
	if c.BufferSize <= 0 {
		c.BufferSize = 10000
	}
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 512
	}
	c.MaxInFlight = max(1, min(c.MaxInFlight, c.BufferSize/4))
	if c.Linger <= 0 {
		c.Linger = 2 * time.Millisecond
	}
	if c.StopTimeout <= 0 {
		c.StopTimeout = 5 * time.Second
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	if len(c.Brokers) == 0 {
		return errors.New("eventsink: Brokers is empty")
	}
	if c.Topic == "" {
		return errors.New("eventsink: Topic is empty")
	}
	if c.BufferSize < 2 {
		return fmt.Errorf("eventsink: BufferSize %d: must be at least 2", c.BufferSize)
	}
	return nil
}
