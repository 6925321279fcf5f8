// Package kafkaconn is the one place that turns the Kafka transport
// settings (TLS, SASL: its Config, which internal/replica maps from the
// COORDINATOR_KAFKA_* variables) into franz-go options. Every Kafka client
// of the coordinator (the trigger consumer and its DLQ producer, the event
// sink, the topic admin, `coordinator trigger` and `coordinator watch`)
// takes its options from Options, so none can be left on plaintext, and
// franz-go's own log lines of each reach the coordinator's log (Logger).
//
// Check tells the failures retrying cannot mend (credentials the broker
// rejects, a certificate that does not verify, a TLS listener reached
// without TLS) from a broker that is merely down, so that a replica with a
// wrong password exits at once (69) instead of retrying forever.
package kafkaconn

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/telco-platform/coordinator/internal/tlsfiles"
)

// SASL mechanisms of Config.SASLMechanism.
const (
	SASLPlain       = "PLAIN"
	SASLScramSHA256 = "SCRAM-SHA-256"
	SASLScramSHA512 = "SCRAM-SHA-512"
)

// Config is how every Kafka client of a process dials its brokers.
type Config struct {
	// TLS dials the brokers over TLS (COORDINATOR_KAFKA_TLS; on too when a
	// TLS file is set). Default false.
	TLS bool
	// TLSFiles are the PEM files: the CA bundle that verifies the brokers
	// (default: the system roots) and a client certificate and key
	// (COORDINATOR_KAFKA_TLS_*_FILE).
	TLSFiles tlsfiles.Files
	// SASLMechanism is SASLPlain, SASLScramSHA256 or SASLScramSHA512;
	// empty means no SASL (COORDINATOR_KAFKA_SASL_MECHANISM).
	SASLMechanism string
	// SASLUsername and SASLPassword are the SASL credentials.
	SASLUsername, SASLPassword string
}

// tls reports whether the clients dial over TLS: explicitly, or because a
// TLS file is set.
func (c Config) tls() bool { return c.TLS || c.TLSFiles.Any() }

// Options returns the TLS and SASL options of cfg (none for a plaintext,
// unauthenticated cluster) and, when log is not nil, the option that sends
// franz-go's own log lines to log (Logger). The seed brokers, client id and
// the client's own options are the caller's.
func Options(cfg Config, log *slog.Logger) ([]kgo.Opt, error) {
	var opts []kgo.Opt
	if log != nil {
		opts = append(opts, kgo.WithLogger(Logger(log)))
	}
	if cfg.tls() {
		tc, err := cfg.TLSFiles.Config()
		if err != nil {
			return nil, fmt.Errorf("kafkaconn: %w", err)
		}
		opts = append(opts, kgo.DialTLSConfig(tc))
	}
	if cfg.SASLMechanism != "" {
		m, err := mechanism(cfg.SASLMechanism, cfg.SASLUsername, cfg.SASLPassword)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}

func mechanism(name, user, password string) (sasl.Mechanism, error) {
	switch name {
	case SASLPlain:
		return plain.Auth{User: user, Pass: password}.AsMechanism(), nil
	case SASLScramSHA256:
		return scram.Auth{User: user, Pass: password}.AsSha256Mechanism(), nil
	case SASLScramSHA512:
		return scram.Auth{User: user, Pass: password}.AsSha512Mechanism(), nil
	}
	return nil, fmt.Errorf("kafkaconn: SASL mechanism %q: must be %s, %s or %s", name,
		SASLPlain, SASLScramSHA256, SASLScramSHA512)
}

// Describe is a log-friendly summary of the transport: "plaintext",
// "tls", "sasl_ssl/SCRAM-SHA-512 user=coordinator", ... (no secrets).
func Describe(cfg Config) string {
	proto := "plaintext"
	switch {
	case cfg.tls() && cfg.SASLMechanism != "":
		proto = "sasl_ssl"
	case cfg.tls():
		proto = "tls"
	case cfg.SASLMechanism != "":
		proto = "sasl_plaintext"
	}
	if cfg.SASLMechanism == "" {
		return proto
	}
	return proto + "/" + cfg.SASLMechanism + " user=" + cfg.SASLUsername
}

// Failures that retrying cannot mend. Classify wraps a franz-go error in one
// of them; errors.Is tells them apart.
var (
	// ErrAuthentication: the broker rejected the SASL credentials or mechanism.
	ErrAuthentication = errors.New("kafkaconn: the broker rejected the SASL credentials")
	// ErrCertificate: the broker's certificate did not verify, or the broker
	// rejected ours.
	ErrCertificate = errors.New("kafkaconn: TLS handshake with the broker failed")
	// ErrHandshake: the broker closed the connection before answering or
	// answered in another protocol, which is what a TLS or SASL listener
	// does to a client that speaks neither.
	ErrHandshake = errors.New("kafkaconn: the broker closed the connection at once")
)

// Error is a failure that retrying cannot mend, with a hint at the settings
// to check. Its message holds no secret: franz-go's and the broker's
// messages name the mechanism, never the password.
type Error struct {
	Kind error // ErrAuthentication, ErrCertificate or ErrHandshake
	Hint string
	Err  error
}

func (e *Error) Error() string {
	return fmt.Sprintf("%v (%s): %v", e.Kind, e.Hint, e.Err)
}

func (e *Error) Unwrap() []error { return []error{e.Kind, e.Err} }

// Classify returns an *Error when err (from any franz-go call) is a failure
// that retrying cannot mend, and err unchanged otherwise (nil stays nil).
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.UnsupportedSaslMechanism),
		errors.Is(err, kerr.IllegalSaslState):
		return &Error{Kind: ErrAuthentication, Err: err,
			Hint: "check COORDINATOR_KAFKA_SASL_MECHANISM, COORDINATOR_KAFKA_SASL_USERNAME and COORDINATOR_KAFKA_SASL_PASSWORD or COORDINATOR_KAFKA_SASL_PASSWORD_FILE"}
	case isCertificateError(err):
		return &Error{Kind: ErrCertificate, Err: err,
			Hint: "check COORDINATOR_KAFKA_TLS_CA_FILE against the broker's certificate and host name, and the client certificate if the broker asks for one"}
	case isFirstReadEOF(err), isWrongProtocol(err):
		return &Error{Kind: ErrHandshake, Err: err,
			Hint: "a TLS or SASL listener? set COORDINATOR_KAFKA_TLS / COORDINATOR_KAFKA_SASL_MECHANISM to match it"}
	}
	return err
}

// Fatal reports whether err is a failure that retrying cannot mend.
func Fatal(err error) bool {
	var e *Error
	return errors.As(Classify(err), &e)
}

// Check asks the brokers for metadata once and returns Classify of the
// outcome: nil, an *Error (credentials, certificates), or the plain error of
// an unreachable cluster.
func Check(ctx context.Context, cl *kgo.Client) error {
	return Classify(cl.Ping(ctx))
}

func isCertificateError(err error) bool {
	var (
		unknownAuthority x509.UnknownAuthorityError
		hostname         x509.HostnameError
		invalid          x509.CertificateInvalidError
		verification     *tls.CertificateVerificationError
		alert            tls.AlertError
		header           tls.RecordHeaderError
	)
	return errors.As(err, &unknownAuthority) || errors.As(err, &hostname) || errors.As(err, &invalid) ||
		errors.As(err, &verification) || errors.As(err, &alert) || errors.As(err, &header) ||
		// An alert from the broker (it rejected our certificate) has no
		// exported type.
		strings.Contains(err.Error(), "remote error: tls: ")
}

// isWrongProtocol: franz-go read a frame size that is really the start of a
// TLS alert (a plaintext client on a TLS listener) or of an HTTP response;
// it says so only in its message.
func isWrongProtocol(err error) bool {
	return strings.Contains(err.Error(), "invalid large response size")
}

func isFirstReadEOF(err error) bool {
	var eof *kgo.ErrFirstReadEOF
	return errors.As(err, &eof)
}
