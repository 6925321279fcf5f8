package trigger

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"github.com/telco-platform/coordinator/internal/billrun"
	"github.com/telco-platform/coordinator/internal/job"
)

// Reasons a trigger record is rejected: the `reason` header of its
// dead-letter copy and the reason of its trigger.rejected event.
const (
	ReasonTooLarge      = "too_large"
	ReasonMalformedJSON = "malformed_json"
	ReasonMissingPeriod = "missing_period"
	ReasonBadPeriod     = "bad_period"
	ReasonKeyMismatch   = "key_mismatch"
	ReasonBadRequestID  = "bad_request_id"
	ReasonBadRequester  = "bad_requested_by"
	ReasonUnknownTopic  = "unknown_topic"
)

// DefaultMaxRecordBytes bounds a trigger record's value (64 KiB).
const DefaultMaxRecordBytes = 64 << 10

// maxIDLen bounds request_id and requested_by.
const maxIDLen = 128

// RejectError says why a trigger cannot be processed no matter how often it
// is retried. It matches job.ErrBadInput.
type RejectError struct {
	Reason string
	Detail string
}

func (e *RejectError) Error() string { return "trigger: rejected (" + e.Reason + "): " + e.Detail }

func (e *RejectError) Is(target error) bool { return target == job.ErrBadInput }

func reject(reason, format string, args ...any) *RejectError {
	return &RejectError{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// Request is a decoded trigger record.
type Request struct {
	// Period is set for bill-run requests ("2026-11").
	Period      string
	RequestID   string
	RequestedBy string
}

type wireRequest struct {
	Period      *string `json:"period"`
	RequestID   *string `json:"request_id"`
	RequestedBy *string `json:"requested_by"`
}

// DecodeBillRun decodes a billing.billrun.requested record: value
// {"period":"2026-11","request_id":"...","requested_by":"..."}, key the
// period. The value is authoritative; an empty key is accepted, but a key
// that names another period is rejected (key_mismatch) rather than guessed
// at: the producer is confused, and records keyed by one period but meaning
// another would break per-period ordering on the partition. Unknown fields
// are ignored, so producers may add some. maxBytes <= 0 means
// DefaultMaxRecordBytes.
func DecodeBillRun(key, value []byte, maxBytes int) (Request, error) {
	w, err := decodeValue(value, maxBytes)
	if err != nil {
		return Request{}, err
	}
	if w.Period == nil || *w.Period == "" {
		return Request{}, reject(ReasonMissingPeriod, `value has no "period" (want {"period":"YYYY-MM"})`)
	}
	p, err := billrun.ParsePeriod(*w.Period)
	if err != nil {
		return Request{}, reject(ReasonBadPeriod, "%s", trimBadInput(err))
	}
	if len(key) > 0 && string(key) != p.String() {
		return Request{}, reject(ReasonKeyMismatch, "record key %q does not match period %q", clip(key), p.String())
	}
	r, err := requestOf(w)
	r.Period = p.String()
	return r, err
}

// DecodeReaper decodes a subscription.msisdn-reaper.requested record: value
// {"request_id":"...","requested_by":"..."} (both optional, but the value
// must be a JSON object).
func DecodeReaper(value []byte, maxBytes int) (Request, error) {
	w, err := decodeValue(value, maxBytes)
	if err != nil {
		return Request{}, err
	}
	return requestOf(w)
}

func decodeValue(value []byte, maxBytes int) (wireRequest, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRecordBytes
	}
	var w wireRequest
	if len(value) > maxBytes {
		return w, reject(ReasonTooLarge, "value is %d bytes, limit %d", len(value), maxBytes)
	}
	if !utf8.Valid(value) {
		return w, reject(ReasonMalformedJSON, "value is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(value)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return w, reject(ReasonMalformedJSON, "value is not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&w); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return w, reject(ReasonMalformedJSON, "field %q must be a %s, got %s", te.Field, te.Type, te.Value)
		}
		return w, reject(ReasonMalformedJSON, "%v", err)
	}
	if dec.More() {
		return w, reject(ReasonMalformedJSON, "trailing data after the JSON object")
	}
	return w, nil
}

func requestOf(w wireRequest) (Request, error) {
	var r Request
	if w.RequestID != nil {
		r.RequestID = *w.RequestID
		if err := checkRequestID(r.RequestID); err != nil {
			return Request{}, err
		}
	}
	if w.RequestedBy != nil {
		r.RequestedBy = *w.RequestedBy
		if len(r.RequestedBy) > maxIDLen {
			return Request{}, reject(ReasonBadRequester, "requested_by is %d bytes, limit %d", len(r.RequestedBy), maxIDLen)
		}
		for _, c := range r.RequestedBy {
			if !unicode.IsPrint(c) {
				return Request{}, reject(ReasonBadRequester, "requested_by has unprintable character %q", c)
			}
		}
	}
	return r, nil
}

// checkRequestID accepts 1..128 characters from [A-Za-z0-9._:/-], so request
// ids print cleanly in logs, events and headers. An absent request_id is
// fine (the consumer derives one); an empty string is not.
func checkRequestID(id string) error {
	if id == "" {
		return reject(ReasonBadRequestID, "request_id is empty (omit it to have one derived)")
	}
	if len(id) > maxIDLen {
		return reject(ReasonBadRequestID, "request_id is %d bytes, limit %d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
		if !ok {
			return reject(ReasonBadRequestID, "request_id has character %q at %d (allowed: A-Z a-z 0-9 . _ : / -)", c, i)
		}
	}
	return nil
}

// trimBadInput drops the "bad input: " prefix job.BadInput adds.
func trimBadInput(err error) string {
	s := err.Error()
	const p = "bad input: "
	if len(s) > len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}

// clip shortens b for an error message.
func clip(b []byte) string {
	if len(b) > 64 {
		return string(b[:64]) + "..."
	}
	return string(b)
}
