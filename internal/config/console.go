package config

import "time"

// Console is the operator console (internal/console) and its tables;
// internal/replica maps it onto the console's Config.
type Console struct {
	// Enabled serves the operator console under /ui/ and keeps its tables
	// (run history, events index, heartbeats). Default true.
	Enabled bool
	// SessionTTL is how long a console login lasts. Default 8h.
	SessionTTL time.Duration
	// Retention is how long run history and indexed events are kept.
	// Default 720h (30 days), at least 1h.
	Retention time.Duration
	// HeartbeatInterval is how often a replica writes its heartbeat row.
	// Default 5s.
	HeartbeatInterval time.Duration
	// MaxStreams bounds the console's event streams per replica. Default
	// 100.
	MaxStreams int
}

func consoleSettings() []setting {
	return []setting{
		boolean("COORDINATOR_CONSOLE_ENABLED", "console-enabled", "serve the operator console under /ui/ and keep its tables (run history, events index, heartbeats)",
			"true", func(c *Config) *bool { return &c.Console.Enabled }).in(sectionFurther, "serve the operator console under `/ui/` and keep its tables: the run history, the events index (consumer group `<COORDINATOR_KAFKA_GROUP>-console`), heartbeats, sessions ([console.md](console.md))"),
		dur("COORDINATOR_CONSOLE_SESSION_TTL", "console-session-ttl", "how long a console login lasts (1m to 168h)", "8h",
			time.Minute, 7*24*time.Hour, func(c *Config) *time.Duration { return &c.Console.SessionTTL }).in(sectionFurther, "how long a console login lasts (1m..168h)"),
		dur("COORDINATOR_CONSOLE_RETENTION", "console-retention", "how long the run history and the events index keep rows", "720h",
			time.Hour, 0, func(c *Config) *time.Duration { return &c.Console.Retention }).in(sectionFurther, "how long the run history and the events index keep rows (at least 1h); pruned hourly by every replica"),
		dur("COORDINATOR_CONSOLE_HEARTBEAT_INTERVAL", "console-heartbeat-interval", "how often a replica writes its heartbeat row (missing after 3)", "5s",
			100*time.Millisecond, 0, func(c *Config) *time.Duration { return &c.Console.HeartbeatInterval }).in(sectionFurther, "how often a replica writes its heartbeat row (a replica not seen for three is shown missing; min 100ms)"),
		integer("COORDINATOR_CONSOLE_MAX_STREAMS", "console-max-streams", "int", "console event streams open at once on a replica (more answer 503)", "100",
			1, 10000, func(c *Config) *int { return &c.Console.MaxStreams }).in(sectionFurther, "console event streams open at once on a replica; more answer 503 (1..10000)"),
	}
}
