// Package kinds is the one list of the kinds of owned run this coordinator
// serves, and the one place the process's configuration reaches them: each
// kind takes a Config of its own package, mapped here from
// internal/config (as cmd/coordinator/wiring_lock.go maps it onto the
// lock). Adding a kind is its package plus two lines here, its import and
// its entry in Config.Kinds (and a Config field and its mapping in ConfigOf
// when it has settings of its own); every
// transport (Kafka consumer, cron, HTTP API, `coordinator run` and
// `trigger`) and the topics to create follow from the list.
package kinds

import (
	"time"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/config"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/replenish"
)

// Config is every kind's own configuration.
type Config struct {
	Billrun billrun.Config
	Reaper  msisdnreaper.Config
}

// ConfigOf maps the process's configuration onto each kind's own. A zero
// field of the process's configuration leaves the kind's default.
func ConfigOf(cfg config.Config) Config {
	var minHold time.Duration // unset: the reaper's default, from its schedule
	if d := cfg.Reaper.MinHold; d != nil {
		minHold = *d
		if minHold == 0 {
			minHold = -1 // set to 0: no hold, whatever the schedule
		}
	}
	return Config{
		Billrun: billrun.Config{
			Schedule: cfg.Billrun.Schedule, BatchSize: cfg.Billrun.BatchSize, Workers: cfg.Billrun.Workers,
			Calendar: billrun.Calendar{Zone: cfg.Billrun.Zone, MaxAgeMonths: cfg.Billrun.MaxAgeMonths},
		},
		Reaper: msisdnreaper.Config{
			Schedule: cfg.Reaper.Schedule, Lease: cfg.Reaper.Lease, BatchSize: cfg.Reaper.BatchSize, MinHold: minHold,
		},
	}
}

// Kinds are the kinds, in the order of help, topics and routes.
func (c Config) Kinds() []owned.Kind {
	return []owned.Kind{
		billrun.New(c.Billrun),
		msisdnreaper.NewSweepKind(c.Reaper),
		replenish.New(),
	}
}

// Registry is Kinds, checked for clashes (names, commands, topics, paths).
func (c Config) Registry() (*owned.Registry, error) { return owned.NewRegistry(c.Kinds()...) }

// Registry is the registry of the process's configuration.
func Registry(cfg config.Config) (*owned.Registry, error) { return ConfigOf(cfg).Registry() }
