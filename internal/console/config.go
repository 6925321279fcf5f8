package console

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/telco-platform/coordinator/internal/adminauth"
)

// Defaults and bounds of Config (COORDINATOR_CONSOLE_* in docs/configuration.md).
const (
	DefaultSessionTTL   = 8 * time.Hour
	MinSessionTTL       = time.Minute
	MaxSessionTTL       = 7 * 24 * time.Hour
	DefaultMaxStreams   = 100
	DefaultStreamBuffer = 256
	DefaultStreamRate   = 200
	DefaultPageSize     = 50
	// DefaultHeartbeatInterval is how often replicas write their heartbeat;
	// a replica not seen for three intervals shows as missing.
	DefaultHeartbeatInterval = 5 * time.Second
	// DefaultRetention is how long run history and events are kept.
	DefaultRetention = 30 * 24 * time.Hour
)

// Config is the console's own configuration. Zero fields take the defaults
// above; Validate names what is wrong.
type Config struct {
	// Replica is this replica's id (shown in every page's header).
	Replica string
	// Tokens are the admin tokens a login may present (adminauth): a
	// session needs one with the read scope; the action needs mutate.
	Tokens []adminauth.Token
	// Kinds are the kinds of owned run, by name (the runs pages).
	Kinds []string
	// Action is the one thing the console starts: a bill run of a closed
	// period. Zero: no action.
	Action Action
	// SessionTTL is how long a login lasts. Default 8h, 1m to 7 days.
	SessionTTL time.Duration
	// HeartbeatInterval is the replicas' heartbeat interval: a replica not
	// seen for three of them is missing. Default 5s.
	HeartbeatInterval time.Duration
	// MaxStreams bounds the event streams open at once on this replica
	// (more answer 503). Default 100.
	MaxStreams int
	// StreamBuffer is each stream's buffer of events; a stream whose
	// reader falls further behind loses events and is told so. Default 256.
	StreamBuffer int
	// StreamRate bounds the events one stream sends per second; more are
	// dropped for it and it is told. Default 200.
	StreamRate int
	// PageSize is the rows of a runs page. Default 50, at most 200.
	PageSize int
	// Log gets the logins, logouts and refusals (never a token or a
	// session id). Default: discard.
	Log *slog.Logger
	// Registerer gets coordinator_console_* series. Nil: not registered.
	Registerer prometheus.Registerer
	// Now is the clock (tests). Default time.Now.
	Now func() time.Time

	// streamCheck is how often a stream pings and re-checks its session
	// (tests shorten it). Default streamPing.
	streamCheck time.Duration
}

// Action is a run the console may start: POST Path of the admin API with
// {Field: value}.
type Action struct {
	// Kind is the kind's name ("billrun"), Path its POST path
	// ("/v1/billruns"), Field the body's one field ("period").
	Kind, Path, Field string
	// Label and Placeholder describe the field in the form.
	Label, Placeholder string
}

func (c Config) withDefaults() Config {
	c.SessionTTL = cmp.Or(c.SessionTTL, DefaultSessionTTL)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.MaxStreams = cmp.Or(c.MaxStreams, DefaultMaxStreams)
	c.StreamBuffer = cmp.Or(c.StreamBuffer, DefaultStreamBuffer)
	c.StreamRate = cmp.Or(c.StreamRate, DefaultStreamRate)
	c.PageSize = cmp.Or(c.PageSize, DefaultPageSize)
	c.streamCheck = cmp.Or(c.streamCheck, streamPing)
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

// Validate says what is wrong with c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.SessionTTL < MinSessionTTL || c.SessionTTL > MaxSessionTTL {
		errs = append(errs, fmt.Errorf("console: SessionTTL %s: must be between %s and %s", c.SessionTTL, MinSessionTTL, MaxSessionTTL))
	}
	if c.HeartbeatInterval < 100*time.Millisecond {
		errs = append(errs, fmt.Errorf("console: HeartbeatInterval %s: must be at least 100ms", c.HeartbeatInterval))
	}
	if c.MaxStreams < 1 || c.MaxStreams > 10000 {
		errs = append(errs, fmt.Errorf("console: MaxStreams %d: must be 1 to 10000", c.MaxStreams))
	}
	if c.StreamBuffer < 1 || c.StreamBuffer > 100000 {
		errs = append(errs, fmt.Errorf("console: StreamBuffer %d: must be 1 to 100000", c.StreamBuffer))
	}
	if c.StreamRate < 1 || c.StreamRate > 100000 {
		errs = append(errs, fmt.Errorf("console: StreamRate %d: must be 1 to 100000 events a second", c.StreamRate))
	}
	if c.PageSize < 1 || c.PageSize > 200 {
		errs = append(errs, fmt.Errorf("console: PageSize %d: must be 1 to 200", c.PageSize))
	}
	if a := c.Action; a != (Action{}) && (a.Kind == "" || a.Path == "" || a.Field == "") {
		errs = append(errs, errors.New("console: Action needs Kind, Path and Field"))
	}
	if err := adminauth.Check(c.Tokens); err != nil {
		errs = append(errs, fmt.Errorf("console: %w", err))
	}
	return errors.Join(errs...)
}
