package owned

import (
	"errors"
	"fmt"
	"strings"
)

// Registry is the kinds one process serves, checked once for clashes: no two
// kinds share a name (and so a lock-key namespace), a CLI command, a Kafka
// topic or an HTTP path. Transports iterate over it; none names a kind.
type Registry struct {
	kinds     []Kind
	byName    map[string]Kind
	byCommand map[string]Kind
	byTopic   map[string]Kind
}

// NewRegistry checks kinds and keeps them in the given order (the order of
// help, topics and routes).
func NewRegistry(kinds ...Kind) (*Registry, error) {
	r := &Registry{byName: map[string]Kind{}, byCommand: map[string]Kind{}, byTopic: map[string]Kind{}}
	paths := map[string]string{}
	for _, k := range kinds {
		if k == nil {
			return nil, errors.New("owned: nil Kind")
		}
		if err := k.check(); err != nil {
			return nil, err
		}
		s := Normalize(k.Spec())
		if err := checkName(s.Name); err != nil {
			return nil, err
		}
		if _, dup := r.byName[s.Name]; dup {
			return nil, fmt.Errorf("owned: two kinds named %q", s.Name)
		}
		if other, dup := r.byCommand[s.Command]; dup {
			return nil, fmt.Errorf("owned: kinds %q and %q share the command %q", other.Spec().Name, s.Name, s.Command)
		}
		if s.Topic != "" {
			if other, dup := r.byTopic[s.Topic]; dup {
				return nil, fmt.Errorf("owned: kinds %q and %q share the topic %q", other.Spec().Name, s.Name, s.Topic)
			}
			r.byTopic[s.Topic] = k
		}
		if s.HTTPPath != "" {
			if !strings.HasPrefix(s.HTTPPath, "/") || strings.ContainsAny(s.HTTPPath, "{} ") {
				return nil, fmt.Errorf("owned: kind %q: HTTPPath %q must be a plain absolute path", s.Name, s.HTTPPath)
			}
			if other, dup := paths[s.HTTPPath]; dup {
				return nil, fmt.Errorf("owned: kinds %q and %q share the path %q", other, s.Name, s.HTTPPath)
			}
			paths[s.HTTPPath] = s.Name
		}
		r.byName[s.Name] = k
		r.byCommand[s.Command] = k
		r.kinds = append(r.kinds, k)
	}
	return r, nil
}

// Normalize fills a Spec's defaults (Command = Name).
func Normalize(s Spec) Spec {
	if s.Command == "" {
		s.Command = s.Name
	}
	return s
}

func checkName(name string) error {
	if name == "" || len(name) > 64 {
		return fmt.Errorf("owned: kind name %q must be 1 to 64 characters", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("owned: kind name %q: character %q not allowed (a-z 0-9 -)", name, c)
		}
	}
	return nil
}

// Kinds returns the kinds in registration order.
func (r *Registry) Kinds() []Kind { return append([]Kind(nil), r.kinds...) }

// Lookup returns the kind named name.
func (r *Registry) Lookup(name string) (Kind, bool) {
	k, ok := r.byName[name]
	return k, ok
}

// ByCommand returns the kind `coordinator run <command>` names.
func (r *Registry) ByCommand(command string) (Kind, bool) {
	k, ok := r.byCommand[command]
	return k, ok
}

// ByTopic returns the kind whose trigger topic is topic (its contract name,
// before any prefix).
func (r *Registry) ByTopic(topic string) (Kind, bool) {
	k, ok := r.byTopic[topic]
	return k, ok
}

// Topics are the kinds' trigger topics (contract names), in registration
// order.
func (r *Registry) Topics() []string {
	var out []string
	for _, k := range r.kinds {
		if t := k.Spec().Topic; t != "" {
			out = append(out, t)
		}
	}
	return out
}

// Commands are the kinds' CLI commands, in registration order.
func (r *Registry) Commands() []string {
	out := make([]string, 0, len(r.kinds))
	for _, k := range r.kinds {
		out = append(out, Normalize(k.Spec()).Command)
	}
	return out
}
