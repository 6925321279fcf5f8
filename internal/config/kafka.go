package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

// Kafka is the brokers, the trigger consumer and every Kafka client's
// transport. internal/replica maps it onto the consumer's, the event
// sink's and kafkaconn's Configs.
type Kafka struct {
	// Brokers are the seed brokers. Default 127.0.0.1:9092.
	Brokers []string
	// CreateTopics creates missing contract topics at start. Default true.
	CreateTopics bool
	// Group is the trigger consumer group. Default "coordinator".
	Group string
	// SessionTimeout is the trigger consumer group's session timeout: how
	// long after a replica dies its partitions move. `serve` refuses a
	// Lock.WatchdogTimeout + Lock.WaitTime that reaches it. Default 45s.
	SessionTimeout time.Duration
	// TopicPrefix is prepended to every contract topic name. Default
	// empty; tests and shared clusters set it to isolate one deployment.
	TopicPrefix string
	// MaxDecompressedBatchBytes bounds what one fetched trigger batch may
	// decompress to; a batch over it is skipped to the DLQ (reason
	// batch_too_large). Default 8 MiB, 1 MiB to 256 MiB.
	MaxDecompressedBatchBytes int
	// TLS dials the brokers over TLS. Default: true when any Kafka TLS file
	// is set, else false (TLSEnabled).
	TLS bool
	// TLSCAFile, TLSCertFile and TLSKeyFile are PEM files: the CA bundle
	// that verifies the brokers (default: the system roots) and a client
	// certificate and key (brokers with ssl.client.auth).
	TLSCAFile, TLSCertFile, TLSKeyFile string
	// SASLMechanism is PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; empty means
	// no SASL. Default empty.
	SASLMechanism string
	// SASLUsername and SASLPassword are the SASL credentials (the password
	// also from COORDINATOR_KAFKA_SASL_PASSWORD_FILE).
	SASLUsername, SASLPassword string
	// tlsSet records that COORDINATOR_KAFKA_TLS was given explicitly.
	tlsSet bool
}

// DefaultKafkaSessionTimeout is COORDINATOR_KAFKA_SESSION_TIMEOUT's
// default (franz-go's and Kafka's).
const DefaultKafkaSessionTimeout = 45 * time.Second

// SASL mechanisms of COORDINATOR_KAFKA_SASL_MECHANISM (kafkaconn's).
const (
	saslPlain       = "PLAIN"
	saslScramSHA256 = "SCRAM-SHA-256"
	saslScramSHA512 = "SCRAM-SHA-512"
)

// TLSEnabled reports whether Kafka clients dial over TLS: explicitly, or
// because a TLS file is set.
func (k Kafka) TLSEnabled() bool {
	if k.tlsSet {
		return k.TLS
	}
	return k.TLS || k.TLSFiles().Any()
}

// TLSFiles are the Kafka clients' PEM files.
func (k Kafka) TLSFiles() tlsfiles.Files {
	return tlsfiles.Files{CA: k.TLSCAFile, Cert: k.TLSCertFile, Key: k.TLSKeyFile,
		CAVar: "COORDINATOR_KAFKA_TLS_CA_FILE", CertVar: "COORDINATOR_KAFKA_TLS_CERT_FILE", KeyVar: "COORDINATOR_KAFKA_TLS_KEY_FILE"}
}

func kafkaSettings() []setting {
	return []setting{
		{env: "COORDINATOR_KAFKA_BROKERS", flag: "kafka-brokers", typ: "host:port,...", usage: "comma-separated seed brokers",
			def: "127.0.0.1:9092", section: sectionContract, doc: "comma-separated seed brokers, `host:port`",
			apply: func(c *Config, v string) error { c.Kafka.Brokers = splitList(v); return checkBrokers(c.Kafka.Brokers) }},
		boolean("COORDINATOR_KAFKA_CREATE_TOPICS", "kafka-create-topics", "create missing contract topics at start", "true",
			func(c *Config) *bool { return &c.Kafka.CreateTopics }).in(sectionContract, "create the contract's topics at start when missing; `false` = `GET /v1/health` and `coordinator_dependency_up{dependency=\"kafka\"}` name the missing topic (readiness does not depend on it: [runbook](runbook.md#health-readiness-and-dependencies))"),
		text("COORDINATOR_KAFKA_GROUP", "kafka-group", "name", "consumer group of the trigger consumer", "coordinator",
			func(c *Config) *string { return &c.Kafka.Group }, checkName).in(sectionFurther, "consumer group of the trigger consumer"),
		dur("COORDINATOR_KAFKA_SESSION_TIMEOUT", "kafka-session-timeout", "session timeout of the trigger consumer group and of the console's events indexer (a dead replica's partitions move after it)",
			"45s", time.Second, 30*time.Minute, func(c *Config) *time.Duration { return &c.Kafka.SessionTimeout }).
			in(sectionFurther, "session timeout of the trigger consumer group and of the console's events indexer: a dead replica's partitions move after it (1s..30m; the heartbeat is a sixth of it, at most 3s). `serve` exits 64 when `COORDINATOR_LOCK_WATCHDOG_TIMEOUT` + `COORDINATOR_LOCK_WAIT_TIME` reach it: the partition would move while the dead owner's lock is still held"),
		text("COORDINATOR_KAFKA_TOPIC_PREFIX", "kafka-topic-prefix", "prefix", "prefix of every contract topic (isolates tests and tenants)", "",
			func(c *Config) *string { return &c.Kafka.TopicPrefix }, func(v string) error {
				if v == "" {
					return nil
				}
				return checkName(v)
			}).documented("empty").in(sectionFurther, "prepended to every contract topic name (isolates tests and tenants on a shared cluster)"),
		integer("COORDINATOR_KAFKA_MAX_DECOMPRESSED_BATCH_BYTES", "kafka-max-decompressed-batch-bytes", "bytes",
			"bound on what one fetched trigger batch may decompress to; a batch over it is skipped to the DLQ (batch_too_large)",
			"8388608", 1<<20, 256<<20, func(c *Config) *int { return &c.Kafka.MaxDecompressedBatchBytes }).
			in(sectionFurther, "most bytes one fetched trigger batch may decompress to (1 MiB..256 MiB, in bytes); a batch over it is not read: its coordinates go to the DLQ (reason `batch_too_large`) and the partition moves past it. franz-go's own default, 1 GiB, let a compressed bomb exhaust a replica's memory").documented("`8388608` (8 MiB)"),
		{env: "COORDINATOR_KAFKA_TLS", flag: "kafka-tls", typ: "bool", usage: "dial the brokers over TLS (default true when a Kafka TLS file is set)",
			section: sectionTransport, doc: "dial the brokers over TLS (`true` alone: the system roots)", docDefault: "`true` when a Kafka TLS file is set, else `false`",
			apply: func(c *Config, v string) (err error) {
				if v == "" {
					return nil
				}
				c.Kafka.tlsSet = true
				c.Kafka.TLS, err = strconv.ParseBool(v)
				return err
			}},
		path("COORDINATOR_KAFKA_TLS_CA_FILE", "kafka-tls-ca-file", "PEM CA bundle verifying the brokers (default system roots)",
			func(c *Config) *string { return &c.Kafka.TLSCAFile }).in(sectionTransport, "PEM CA bundle that verifies the brokers").documented("system roots"),
		path("COORDINATOR_KAFKA_TLS_CERT_FILE", "kafka-tls-cert-file", "PEM client certificate for the brokers (with the key file)",
			func(c *Config) *string { return &c.Kafka.TLSCertFile }).in(sectionTransport, "PEM client certificate for brokers with `ssl.client.auth`; with the key file"),
		path("COORDINATOR_KAFKA_TLS_KEY_FILE", "kafka-tls-key-file", "PEM private key of the Kafka client certificate",
			func(c *Config) *string { return &c.Kafka.TLSKeyFile }).in(sectionTransport, "its PEM private key"),
		{env: "COORDINATOR_KAFKA_SASL_MECHANISM", flag: "kafka-sasl-mechanism", typ: "mechanism", usage: "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)",
			section: sectionTransport, doc: "`PLAIN` (only with TLS), `SCRAM-SHA-256`, `SCRAM-SHA-512`", docDefault: "empty (no SASL)",
			apply: func(c *Config, v string) error {
				c.Kafka.SASLMechanism = strings.ToUpper(v)
				if v == "" {
					return nil
				}
				return oneOf(c.Kafka.SASLMechanism, saslPlain, saslScramSHA256, saslScramSHA512)
			}},
		text("COORDINATOR_KAFKA_SASL_USERNAME", "kafka-sasl-username", "name", "SASL user name", "",
			func(c *Config) *string { return &c.Kafka.SASLUsername }, nil).in(sectionTransport, "SASL user; required with a mechanism"),
		text("COORDINATOR_KAFKA_SASL_PASSWORD", "kafka-sasl-password", "password", "SASL password; refused as a flag", "",
			func(c *Config) *string { return &c.Kafka.SASLPassword }, nil).
			in(sectionTransport, "SASL password; required with a mechanism").secretIn(secretOpaque, "COORDINATOR_KAFKA_SASL_PASSWORD_FILE"),
	}
}

// validate checks the rules that span the Kafka settings.
func (k Kafka) validate() error {
	files := k.TLSFiles()
	if files.Any() {
		if k.tlsSet && !k.TLS {
			return &Error{Variable: "COORDINATOR_KAFKA_TLS", Flag: "kafka-tls", Value: "false",
				Err: errors.New("contradicts the COORDINATOR_KAFKA_TLS_* files that are set")}
		}
		if err := checkTLSFiles(files); err != nil {
			return err
		}
	}
	saslErr := func(variable, flag, value, msg string) error {
		return &Error{Variable: variable, Flag: flag, Value: value, Err: errors.New(msg)}
	}
	switch {
	case k.SASLMechanism == "" && (k.SASLUsername != "" || k.SASLPassword != ""):
		return saslErr("COORDINATOR_KAFKA_SASL_MECHANISM", "kafka-sasl-mechanism", "",
			"required when a SASL user name or password is set (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)")
	case k.SASLMechanism == "":
	case k.SASLUsername == "":
		return saslErr("COORDINATOR_KAFKA_SASL_USERNAME", "kafka-sasl-username", "",
			"required with COORDINATOR_KAFKA_SASL_MECHANISM="+k.SASLMechanism)
	case k.SASLPassword == "":
		return saslErr("COORDINATOR_KAFKA_SASL_PASSWORD", "kafka-sasl-password", "",
			"required with COORDINATOR_KAFKA_SASL_MECHANISM="+k.SASLMechanism+" (or COORDINATOR_KAFKA_SASL_PASSWORD_FILE)")
	case k.SASLMechanism == saslPlain && !k.TLSEnabled():
		return saslErr("COORDINATOR_KAFKA_SASL_MECHANISM", "kafka-sasl-mechanism", saslPlain,
			"PLAIN sends the password in clear text: enable TLS (COORDINATOR_KAFKA_TLS=true or a COORDINATOR_KAFKA_TLS_* file) or use SCRAM")
	}
	return nil
}

// CheckKafkaSession refuses, for `serve`, a lock watchdog timeout plus wait
// time that reaches the Kafka session timeout: a dead owner's partition
// would then move while its lock is still held, and the new member would
// answer already_owned to its trigger.
func (c Config) CheckKafkaSession() error {
	session := c.Kafka.SessionTimeout
	if session == 0 {
		session = DefaultKafkaSessionTimeout
	}
	if c.Lock.WatchdogTimeout+c.Lock.WaitTime < session {
		return nil
	}
	return &Error{Variable: "COORDINATOR_LOCK_WATCHDOG_TIMEOUT", Flag: "lock-watchdog-timeout", Value: c.Lock.WatchdogTimeout.String(),
		Err: fmt.Errorf("plus COORDINATOR_LOCK_WAIT_TIME (%s) must stay below COORDINATOR_KAFKA_SESSION_TIMEOUT (%s): lower them or raise the session timeout",
			c.Lock.WaitTime, session)}
}

func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func checkBrokers(bs []string) error {
	if len(bs) == 0 {
		return errors.New("at least one broker is required")
	}
	for _, b := range bs {
		if i := strings.LastIndexByte(b, ':'); i <= 0 || i == len(b)-1 {
			return fmt.Errorf("broker %q is not host:port", b)
		} else if _, err := strconv.ParseUint(b[i+1:], 10, 16); err != nil {
			return fmt.Errorf("broker %q has a bad port", b)
		}
	}
	return nil
}

// checkName accepts Kafka's topic/group character set.
func checkName(v string) error {
	if v == "" || len(v) > 200 {
		return errors.New("must be 1 to 200 characters")
	}
	for _, r := range v {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("character %q not allowed (use A-Z a-z 0-9 . _ -)", r)
		}
	}
	return nil
}
