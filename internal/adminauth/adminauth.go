// Package adminauth holds the admin API's bearer tokens: who each one is
// (its name, recorded as the principal of every run it starts), what it may
// do (its scopes), and the constant-time lookup of a presented token.
//
// Tokens come from COORDINATOR_ADMIN_TOKEN (one token named "admin" with
// every scope) and from COORDINATOR_ADMIN_TOKENS_FILE, one token a line:
//
//	# name:scopes:token
//	billing-ops:read,mutate:3f5c...   (at least 32 bytes)
//	grafana:read:9a1e...
//
// Scopes are read (GET /v1/*: locks, run status, dependency health) and
// mutate (POST /v1/*: start runs). Neither implies the other. Errors name
// the line, never the token.
package adminauth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"strings"
)

// MinTokenBytes is the shortest token accepted (256 bits of hex or base64
// is longer; a guessable word is shorter).
const MinTokenBytes = 32

// maxNameLen bounds a token's name (it goes into events and bill_runs).
const maxNameLen = 64

// SingleTokenName is the name of COORDINATOR_ADMIN_TOKEN.
const SingleTokenName = "admin"

// Scope is what a token may do.
type Scope uint8

const (
	// Read allows GET /v1/*.
	Read Scope = 1 << iota
	// Mutate allows POST /v1/* (starting runs).
	Mutate
)

// All is every scope (COORDINATOR_ADMIN_TOKEN).
const All = Read | Mutate

// String is the scopes as they are written in the tokens file.
func (s Scope) String() string {
	var parts []string
	if s&Read != 0 {
		parts = append(parts, "read")
	}
	if s&Mutate != 0 {
		parts = append(parts, "mutate")
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ",")
}

// Has reports whether s includes every scope of want.
func (s Scope) Has(want Scope) bool { return s&want == want }

// ParseScopes reads "read", "mutate" or "read,mutate".
func ParseScopes(v string) (Scope, error) {
	var s Scope
	for _, p := range strings.Split(v, ",") {
		switch strings.TrimSpace(p) {
		case "read":
			s |= Read
		case "mutate":
			s |= Mutate
		default:
			// Not echoed: a line with its fields out of order would show a token.
			return 0, errors.New("unknown scope (want read, mutate or read,mutate)")
		}
	}
	return s, nil
}

// Token is one admin token. Its String, GoString and LogValue hide the
// secret, so a token printed by mistake shows its name only.
type Token struct {
	// Name identifies the caller in logs, events (data.principal) and
	// bill_runs.principal. Lower case letters, digits, '.', '_', '-'.
	Name string
	// Scopes are what it may do.
	Scopes Scope
	// Secret is the bearer token itself, at least MinTokenBytes.
	Secret string
}

func (t Token) String() string             { return fmt.Sprintf("%s(%s)", t.Name, t.Scopes) }
func (t Token) LogValue() slog.Value       { return slog.StringValue(t.String()) }
func (t Token) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(t.String())) }

// CheckSecret says what is wrong with a token's secret, without showing it.
func CheckSecret(secret string) error {
	if len(secret) < MinTokenBytes {
		return fmt.Errorf("must be at least %d bytes, it has %d (generate one: openssl rand -hex 32)", MinTokenBytes, len(secret))
	}
	for i := 0; i < len(secret); i++ {
		if c := secret[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("has a disallowed character at byte %d (printable ASCII without spaces only)", i)
		}
	}
	return nil
}

// CheckName says what is wrong with a token's name. The name is not
// echoed: a line with its fields out of order would show a token.
func CheckName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("the name must be 1 to %d characters, it has %d", maxNameLen, len(name))
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("the name has a disallowed character at byte %d (a-z 0-9 . _ - only)", i)
		}
	}
	return nil
}

// ParseFile reads a tokens file: one name:scopes:token a line; blank lines
// and lines starting with '#' are skipped. The token is everything after
// the second colon. Errors name the line number and never show a token.
func ParseFile(content string) ([]Token, error) {
	var out []Token
	for i, line := range strings.Split(content, "\n") {
		line = strings.TrimSpace(strings.TrimSuffix(line, "\r"))
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		n := i + 1
		name, rest, ok1 := strings.Cut(line, ":")
		scopes, secret, ok2 := strings.Cut(rest, ":")
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("line %d: want name:scopes:token", n)
		}
		t := Token{Name: strings.TrimSpace(name), Secret: strings.TrimSpace(secret)}
		if err := CheckName(t.Name); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		var err error
		if t.Scopes, err = ParseScopes(scopes); err != nil {
			return nil, fmt.Errorf("line %d (%s): %w", n, t.Name, err)
		}
		if err := CheckSecret(t.Secret); err != nil {
			return nil, fmt.Errorf("line %d (%s): the token %w", n, t.Name, err)
		}
		out = append(out, t)
	}
	if len(out) == 0 {
		return nil, errors.New("no tokens in the file (want name:scopes:token lines)")
	}
	return out, nil
}

// Check refuses a set of tokens in which two share a name or a secret (a
// shared secret would make the principal ambiguous). Errors name the tokens,
// never a secret.
func Check(tokens []Token) error {
	names := map[string]bool{}
	secrets := map[[32]byte]string{}
	for _, t := range tokens {
		if names[t.Name] {
			return fmt.Errorf("two tokens are named %q", t.Name)
		}
		names[t.Name] = true
		h := sha256.Sum256([]byte(t.Secret))
		if other, dup := secrets[h]; dup {
			return fmt.Errorf("tokens %q and %q are the same token", other, t.Name)
		}
		secrets[h] = t.Name
	}
	return nil
}

// Set looks presented tokens up in constant time.
type Set struct {
	entries []entry
}

type entry struct {
	name   string
	scopes Scope
	hash   [32]byte
}

// NewSet builds the lookup; tokens must pass Check and CheckSecret (the
// configuration did). An empty Set authenticates nobody.
func NewSet(tokens []Token) (*Set, error) {
	if err := Check(tokens); err != nil {
		return nil, fmt.Errorf("adminauth: %w", err)
	}
	s := &Set{}
	for _, t := range tokens {
		if err := CheckName(t.Name); err != nil {
			return nil, fmt.Errorf("adminauth: token %q: %w", t.Name, err)
		}
		if err := CheckSecret(t.Secret); err != nil {
			return nil, fmt.Errorf("adminauth: token %q %w", t.Name, err)
		}
		s.entries = append(s.entries, entry{name: t.Name, scopes: t.Scopes, hash: sha256.Sum256([]byte(t.Secret))})
	}
	return s, nil
}

// Empty reports whether the Set has no tokens (the admin API is disabled).
func (s *Set) Empty() bool { return s == nil || len(s.entries) == 0 }

// Principal is an authenticated caller.
type Principal struct {
	Name   string
	Scopes Scope
}

// Authenticate returns the token presented matches. Both sides are hashed
// first and every entry is compared, so the time taken depends neither on
// the token's length and content nor on which entry matched.
func (s *Set) Authenticate(presented string) (Principal, bool) {
	if s.Empty() {
		return Principal{}, false
	}
	got := sha256.Sum256([]byte(presented))
	match := -1
	for i, e := range s.entries {
		eq := subtle.ConstantTimeCompare(got[:], e.hash[:])
		match = subtle.ConstantTimeSelect(eq, i, match)
	}
	if match < 0 {
		return Principal{}, false
	}
	return Principal{Name: s.entries[match].name, Scopes: s.entries[match].scopes}, true
}

// Scopes returns the scopes of the token named name, if there is one (a
// console session re-checks its token at every request: a token removed
// from the configuration ends its sessions at the next restart).
func (s *Set) Scopes(name string) (Scope, bool) {
	if s == nil {
		return 0, false
	}
	for _, e := range s.entries {
		if e.name == name {
			return e.scopes, true
		}
	}
	return 0, false
}

// Fingerprint returns the SHA-256 of the secret of the token named name, if
// there is one. A console session is bound to it: a token rotated (same
// name, new secret) ends the sessions its old secret opened.
func (s *Set) Fingerprint(name string) ([32]byte, bool) {
	if s == nil {
		return [32]byte{}, false
	}
	for _, e := range s.entries {
		if e.name == name {
			return e.hash, true
		}
	}
	return [32]byte{}, false
}
