//go:build testhooks

package replica

import (
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// SetSessionTimeout shortens the trigger consumer's group session timeout,
// so a killed replica's partitions move within seconds instead of 45 s. It
// exists only in binaries built with -tags testhooks; call it before Start.
func (r *Replica) SetSessionTimeout(d time.Duration) {
	r.consumerOpts = append(r.consumerOpts, kgo.SessionTimeout(d), kgo.HeartbeatInterval(d/6))
}
