// Package kinds is the one list of the kinds of owned run this coordinator
// serves. Adding a kind is its package plus one line here; every transport
// (Kafka consumer, cron, HTTP API, `coordinator run` and `trigger`) and the
// topics to create follow from the list.
package kinds

import (
	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/msisdnreaper"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/replenish"
)

// Builtin returns the kinds, in the order of help, topics and routes.
func Builtin() []owned.Kind {
	return []owned.Kind{
		billrun.New(billrun.Config{}),
		msisdnreaper.NewSweepKind(msisdnreaper.Config{}),
		replenish.Kind{},
	}
}

// Registry is Builtin, checked for clashes (names, commands, topics, paths).
func Registry() (*owned.Registry, error) { return owned.NewRegistry(Builtin()...) }
