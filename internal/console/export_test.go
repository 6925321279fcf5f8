package console

import "time"

// SetStreamSessionCheck shortens how often a stream re-checks its session
// (streamPing in production).
func SetStreamSessionCheck(c *Config, d time.Duration) { c.streamCheck = d }
