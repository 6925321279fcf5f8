package owned

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/telco-platform/coordinator/internal/job"
)

// Reasons a trigger is rejected that every kind shares: the `reason` header
// of a dead-lettered record and the reason of its trigger.rejected event.
// Kinds add their own (billrun's bad_period, say).
const (
	ReasonTooLarge      = "too_large"
	ReasonMalformedJSON = "malformed_json"
	ReasonBadRequestID  = "bad_request_id"
	ReasonBadRequester  = "bad_requested_by"
	ReasonUnknownTopic  = "unknown_topic"
	// ReasonDuplicateKey: the trigger's JSON object names a member twice
	// (which of the two a reader keeps is not defined by JSON).
	ReasonDuplicateKey = "duplicate_key"
	// ReasonBadInput is the reason of a decode error that is not a
	// *RejectError but wraps job.ErrBadInput.
	ReasonBadInput = "bad_input"
)

// SharedRejectReasons are the reasons above: every kind's trigger may be
// rejected with any of them.
func SharedRejectReasons() []string {
	return []string{ReasonTooLarge, ReasonMalformedJSON, ReasonBadRequestID, ReasonBadRequester, ReasonUnknownTopic, ReasonDuplicateKey, ReasonBadInput}
}

// RejectError says why a trigger can never be run, however often it is
// retried. It matches job.ErrBadInput.
type RejectError struct {
	// Reason is a short snake_case code (the DLQ's reason header).
	Reason string
	// Detail says what was wrong, naming the value.
	Detail string
	// Unprocessable marks input that is well-formed but cannot be run as
	// asked (a bill run's period that has not ended yet): HTTP answers 422,
	// not 400. The DLQ and the CLI treat it like any rejection.
	Unprocessable bool
	// Fields name the values the rejection is about ("period", "zone"):
	// the problem document's fields member.
	Fields map[string]string
}

func (e *RejectError) Error() string { return "rejected (" + e.Reason + "): " + e.Detail }

func (e *RejectError) Is(target error) bool { return target == job.ErrBadInput }

// Reject builds a *RejectError.
func Reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// RejectionOf returns err as a *RejectError: itself, or ReasonBadInput for
// another error wrapping job.ErrBadInput, or ReasonMalformedJSON otherwise.
func RejectionOf(err error) *RejectError {
	var re *RejectError
	if errors.As(err, &re) {
		return re
	}
	reason := ReasonMalformedJSON
	if errors.Is(err, job.ErrBadInput) {
		reason = ReasonBadInput
	}
	return &RejectError{Reason: reason, Detail: strings.TrimPrefix(err.Error(), job.ErrBadInput.Error()+": ")}
}

// Input is one trigger's JSON object as a kind's Decode sees it: the fields
// besides the envelope (request_id, requested_by), which the transport has
// already checked.
type Input struct {
	// Source is where the trigger came from.
	Source job.Source
	// Key is the Kafka record key (nil for other sources).
	Key []byte

	fields map[string]json.RawMessage
	strict bool
}

// NewInput is the transport's side: fields are the object's members
// without the envelope. strict makes Decode refuse fields the kind does not
// know (HTTP); otherwise they are ignored, so producers may add some (Kafka).
func NewInput(src job.Source, key []byte, fields map[string]json.RawMessage, strict bool) Input {
	return Input{Source: src, Key: key, fields: fields, strict: strict}
}

// Has reports whether the trigger has the field, null included.
func (in Input) Has(name string) bool {
	_, ok := in.fields[name]
	return ok
}

// Decode fills v (a pointer to a struct with json tags) from the fields. A
// field of the wrong type, or in strict mode one that v does not have, is a
// *RejectError with ReasonMalformedJSON naming it.
func (in Input) Decode(v any) error {
	b, err := json.Marshal(in.fields)
	if err != nil {
		return Reject(ReasonMalformedJSON, "%v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if in.strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Reject(ReasonMalformedJSON, "field %q must be a %s, got %s", te.Field, te.Type, te.Value)
		}
		if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return Reject(ReasonMalformedJSON, "unknown field %s", name)
		}
		return Reject(ReasonMalformedJSON, "%v", err)
	}
	return nil
}

// ErrNotFound is a StatusReader's answer for an id with no run.
var ErrNotFound = errors.New("owned: no such run")

// RejectDuplicateKeys returns a *RejectError (ReasonDuplicateKey) naming
// the first member that an object of the JSON value data names twice, at
// any depth; nil when there is none or data is not valid JSON (its decoder
// reports that). Go's decoder keeps the last of two members silently; the
// transports refuse both (a Kafka record goes to the DLQ, HTTP answers 400).
func RejectDuplicateKeys(data []byte) error {
	type object struct {
		keys      map[string]bool
		expectKey bool
	}
	var stack []*object // nil entries are arrays
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	top := func() *object {
		if len(stack) == 0 {
			return nil
		}
		return stack[len(stack)-1]
	}
	valueDone := func() { // a value of the enclosing object ended: a key comes next
		if o := top(); o != nil {
			o.expectKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF, or a syntax error the caller's decoding reports
		}
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{':
				stack = append(stack, &object{keys: map[string]bool{}, expectKey: true})
			case '[':
				stack = append(stack, nil)
			default: // '}' or ']'
				stack = stack[:len(stack)-1]
				valueDone()
			}
		case string:
			if o := top(); o != nil && o.expectKey {
				if o.keys[t] {
					return Reject(ReasonDuplicateKey, "member %q is given twice", t)
				}
				o.keys[t] = true
				o.expectKey = false
				continue
			}
			valueDone()
		default:
			valueDone()
		}
	}
}
