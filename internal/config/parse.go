package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/telco-platform/coordinator/internal/base10"
)

// maxSecretFileBytes bounds what a *_FILE variable may point at.
const maxSecretFileBytes = 64 << 10

// Binding ties the configuration flags to a FlagSet that may carry a
// command's own flags too.
type Binding struct {
	fs       *flag.FlagSet
	getenv   func(string) string
	lookup   func(string) (string, bool)
	vals     []*string
	fileVals []*string
}

// Option shapes Bind and Load.
type Option func(*Binding)

// WithLookup tells an empty variable from an unset one (os.LookupEnv): a
// setting where empty means off (COORDINATOR_REAPER_SCHEDULE) is then off
// when its variable is set and empty. Without it an empty variable is
// unset, and takes the default.
func WithLookup(lookup func(string) (string, bool)) Option {
	return func(b *Binding) { b.lookup = lookup }
}

// Bind adds every configuration flag to fs, each with its type and its
// default (as the environment leaves it; secrets are not shown) in -h.
// After fs.Parse, call Config.
func Bind(fs *flag.FlagSet, getenv func(string) string, opts ...Option) *Binding {
	if getenv == nil {
		getenv = os.Getenv
	}
	b := &Binding{fs: fs, getenv: getenv}
	for _, o := range opts {
		o(b)
	}
	if b.lookup == nil {
		b.lookup = func(name string) (string, bool) {
			v := getenv(name)
			return v, v != ""
		}
	}
	for _, s := range settings() {
		v := &flagValue{bool: s.typ == "bool"}
		if s.secret == public {
			v.raw = s.defaultOf(getenv)
		}
		// A back-quoted type is what -h shows after the flag's name; a bool
		// flag takes no argument, so it shows none.
		quoted := "`" + s.typ + "`"
		if v.bool {
			quoted = s.typ
		}
		fs.Var(v, s.flag, fmt.Sprintf("%s (%s, $%s)", s.usage, quoted, s.env))
		v.raw = ""
		b.vals = append(b.vals, &v.raw)
		var fv *string
		if s.file != "" {
			fv = fs.String(s.flag+"-file", "", "file holding the value of --"+s.flag+" (`path`, $"+s.file+")")
		}
		b.fileVals = append(b.fileVals, fv)
	}
	return b
}

// flagValue keeps a flag's raw text: Config parses it with the variable's
// own rules, so that a bad flag value is reported like a bad variable.
type flagValue struct {
	raw  string
	bool bool
}

func (v *flagValue) String() string {
	if v == nil {
		return ""
	}
	return v.raw
}

func (v *flagValue) Set(s string) error { v.raw = s; return nil }

func (v *flagValue) IsBoolFlag() bool { return v != nil && v.bool }

// Config reads the environment, then the parsed flags (a flag wins over its
// variable), fills defaults and validates. Nothing is contacted; files named
// by *_FILE variables and TLS files are read.
func (b *Binding) Config() (Config, error) {
	set := map[string]bool{}
	b.fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var c Config
	for i, s := range settings() {
		v, present := b.lookup(s.env)
		off := present && v == "" && s.emptyIsOff // set, and empty: off, not the default
		fromFlag := set[s.flag]
		if fromFlag {
			v = *b.vals[i]
			if s.cmdline != nil {
				if err := s.cmdline(v); err != nil {
					return Config{}, &Error{Variable: s.env, Flag: s.flag, Value: s.show(v), Err: err}
				}
			}
		}
		variable, flagName, fromFile := s.env, s.flag, ""
		if s.file != "" {
			path := b.getenv(s.file)
			if set[s.flag+"-file"] {
				path = *b.fileVals[i]
			}
			if path != "" {
				variable, flagName, fromFile = s.file, s.flag+"-file", path
				if v != "" {
					return Config{}, &Error{Variable: s.file, Flag: flagName, Value: path,
						Err: fmt.Errorf("%s is set too: set one of them", s.env)}
				}
				content, err := readSecretFile(path)
				if err != nil {
					return Config{}, &Error{Variable: s.file, Flag: flagName, Value: path, Err: err}
				}
				v = content
			}
		}
		if v == "" && !fromFlag && fromFile == "" && !off {
			v = s.defaultOf(b.getenv)
		}
		if err := s.apply(&c, v); err != nil {
			shown := s.show(v)
			if fromFile != "" {
				shown = fromFile
			}
			return Config{}, &Error{Variable: variable, Flag: flagName, Value: shown, Err: err}
		}
	}
	if c.ReplicaID == "" {
		host, _ := os.Hostname()
		c.ReplicaID = fmt.Sprintf("%s-%d", cmpOr(host, "replica"), os.Getpid())
	}
	return c, c.validate()
}

// Load is Bind plus Parse for commands with no flags of their own. It returns
// the arguments left after the flags.
func Load(name string, args []string, getenv func(string) string, opts ...Option) (Config, []string, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	b := Bind(fs, getenv, opts...)
	if err := fs.Parse(args); err != nil {
		return Config{}, nil, err
	}
	c, err := b.Config()
	return c, fs.Args(), err
}

// readSecretFile returns the content of a *_FILE variable's file without
// its final line break (files written by echo or editors have one).
func readSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFileBytes+1))
	if err != nil {
		return "", err
	}
	if len(b) > maxSecretFileBytes {
		return "", fmt.Errorf("larger than %d bytes", maxSecretFileBytes)
	}
	b = bytes.TrimSuffix(b, []byte("\n"))
	b = bytes.TrimSuffix(b, []byte("\r"))
	if len(b) == 0 {
		return "", errors.New("the file is empty")
	}
	return string(b), nil
}

// duration parses a Go duration in [lo, hi] (hi 0: no upper bound).
func duration(v string, lo, hi time.Duration) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, fmt.Errorf("not a duration (examples: 500ms, 5s, 1m)")
	}
	if d < lo {
		return 0, fmt.Errorf("must be at least %s", short(lo))
	}
	if hi > 0 && d > hi {
		return 0, fmt.Errorf("must be at most %s", short(hi))
	}
	return d, nil
}

// short prints a bound as it is written: 1h, 30m, 744h, 500ms.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// intBetween parses a base-10 integer (base10: no leading zero or 0x
// prefix) in [lo, hi].
func intBetween(v string, lo, hi int) (int, error) {
	n, err := base10.Parse(v)
	if err != nil {
		return 0, err
	}
	if n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("must be between %d and %d", lo, hi)
	}
	return int(n), nil
}

func oneOf(v string, allowed ...string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("must be one of %s", strings.Join(allowed, ", "))
}

// errorf is fmt.Errorf, for messages built from the settings' values.
func errorf(format string, args ...any) error { return fmt.Errorf(format, args...) }
