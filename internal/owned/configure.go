package owned

import "github.com/telco-platform/coordinator/internal/config"

// Configurer is a Kind whose Decode and Flags depend on the deployment's
// configuration (a bill run admits only closed periods, in the billing
// zone, no older than an age limit). Registry.Configure hands it the
// configuration once it is loaded: NewRunner does so before opening the
// kinds, and `coordinator run|trigger` before building Params from flags.
// Settings the kind was constructed with win over the configuration's.
type Configurer interface {
	Configure(cfg config.Config)
}

// Configure hands cfg to every kind that is a Configurer.
func (r *Registry) Configure(cfg config.Config) {
	for _, k := range r.kinds {
		if c, ok := k.(Configurer); ok {
			c.Configure(cfg)
		}
	}
}
