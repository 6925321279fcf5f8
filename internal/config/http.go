package config

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/telco-platform/coordinator/internal/adminauth"
)

// HTTP is the admin API, health and metrics listener and its tokens.
type HTTP struct {
	// Addr is the listener's address. Default :8080.
	Addr string
	// AdminToken guards /v1/*; empty means /v1/* answers 403. At least
	// MinAdminTokenBytes long. Also from COORDINATOR_ADMIN_TOKEN_FILE.
	AdminToken string
	// AdminTokens are further named tokens with their scopes, from
	// COORDINATOR_ADMIN_TOKENS_FILE (name:scopes:token lines). Default none.
	AdminTokens []adminauth.Token
	// MaxRunsInFlight is how many runs (from any trigger) this replica may
	// have in flight before POST /v1/* answers 429. Default 8.
	MaxRunsInFlight int
}

// MinAdminTokenBytes is the shortest admin token accepted (256 bits of hex
// or base64 is longer; a guessable word is shorter).
const MinAdminTokenBytes = adminauth.MinTokenBytes

// AdminTokenSet is every admin token: COORDINATOR_ADMIN_TOKEN (named
// "admin", every scope) and those of COORDINATOR_ADMIN_TOKENS_FILE. Empty:
// the admin API is disabled (/v1/* answers 403).
func (h HTTP) AdminTokenSet() []adminauth.Token {
	var out []adminauth.Token
	if h.AdminToken != "" {
		out = append(out, adminauth.Token{Name: adminauth.SingleTokenName, Scopes: adminauth.All, Secret: h.AdminToken})
	}
	return append(out, h.AdminTokens...)
}

func httpSettings() []setting {
	return []setting{
		text("COORDINATOR_HTTP_ADDR", "http-addr", "host:port", "admin API, health and metrics listener", ":8080",
			func(c *Config) *string { return &c.HTTP.Addr }, checkAddr).in(sectionContract, "admin API, health and metrics listener"),
		text("COORDINATOR_ADMIN_TOKEN", "admin-token", "token", "bearer token for /v1/*, at least 32 bytes (unset = 403); refused as a flag", "",
			func(c *Config) *string { return &c.HTTP.AdminToken }, checkAdminToken).
			in(sectionContract, "bearer token for `/v1/*`, named `admin`, with the `read` and `mutate` scopes; at least 32 bytes of printable ASCII (shorter: exit 64); with neither it nor `COORDINATOR_ADMIN_TOKENS_FILE`, `/v1/*` answers 403").secretIn(secretOpaque, "COORDINATOR_ADMIN_TOKEN_FILE"),
		{env: "COORDINATOR_ADMIN_TOKENS_FILE", flag: "admin-tokens-file", typ: "path",
			usage:   "file of name:scopes:token lines: named admin tokens with read and/or mutate scopes",
			section: sectionTransport, doc: "file of named admin tokens, one `name:scopes:token` a line (`#` comments and blank lines skipped; scopes `read`, `mutate` or `read,mutate`; names `a-z 0-9 . _ -`); a bad line, a short token, a name or token used twice is exit 64 naming the line, never the token ([security.md](security.md#tokens-and-scopes))",
			apply: func(c *Config, v string) error {
				if v == "" {
					return nil
				}
				content, err := readSecretFile(v)
				if err != nil {
					return err
				}
				c.HTTP.AdminTokens, err = adminauth.ParseFile(content)
				return err
			}},
		integer("COORDINATOR_MAX_RUNS_IN_FLIGHT", "max-runs-in-flight", "int", "runs in flight on this replica (any trigger) at which POST /v1/* answers 429",
			"8", 1, 1024, func(c *Config) *int { return &c.HTTP.MaxRunsInFlight }).in(sectionFurther, "runs in flight on one replica (counted over every trigger) at which `POST /v1/*` answers 429 `TOO_MANY_RUNS` with `Retry-After: 10` and starts nothing; Kafka and cron triggers are never refused (1..1024)"),
	}
}

// validate checks the tokens together (names and tokens used once).
func (h HTTP) validate() error {
	if err := adminauth.Check(h.AdminTokenSet()); err != nil {
		return &Error{Variable: "COORDINATOR_ADMIN_TOKENS_FILE", Flag: "admin-tokens-file", Value: "",
			Err: fmt.Errorf("%w (COORDINATOR_ADMIN_TOKEN is the token named %q)", err, adminauth.SingleTokenName)}
	}
	return nil
}

func checkAdminToken(v string) error {
	if v != "" {
		return adminauth.CheckSecret(v)
	}
	return nil
}

func checkAddr(v string) error {
	i := strings.LastIndexByte(v, ':')
	if i < 0 {
		return errors.New("must be host:port or :port")
	}
	if _, err := strconv.ParseUint(v[i+1:], 10, 16); err != nil {
		return errors.New("bad port")
	}
	return nil
}
