package trigger

import (
	"bytes"
	"encoding/json"
	"errors"
	"unicode"
	"unicode/utf8"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// DefaultMaxRecordBytes bounds a trigger record's value (64 KiB).
const DefaultMaxRecordBytes = 64 << 10

// maxIDLen bounds request_id and requested_by.
const maxIDLen = 128

// Request is a decoded trigger record: the kind's Params and the envelope
// every trigger shares.
type Request struct {
	Params      owned.Params
	RequestID   string
	RequestedBy string
}

// DecodeRecord decodes a Kafka trigger record of kind k. The value is one
// JSON object: the envelope (request_id, requested_by, both optional) plus
// the kind's fields, which k.Decode reads (unknown fields are ignored, so
// producers may add some). It rejects, with a reason: values over maxBytes
// (too_large; maxBytes <= 0 means DefaultMaxRecordBytes), anything that is
// not one JSON object (malformed_json), request ids or requesters that
// would not print cleanly, and whatever k.Decode rejects. Every error is a
// *owned.RejectError matching job.ErrBadInput. A member given twice is
// rejected (duplicate_key) rather than read last-wins.
func DecodeRecord(k owned.Kind, key, value []byte, maxBytes int) (Request, error) {
	fields, err := decodeObject(value, maxBytes)
	if err != nil {
		return Request{}, err
	}
	var r Request
	if r.RequestID, err = envelope(fields, "request_id"); err == nil {
		r.RequestedBy, err = envelope(fields, "requested_by")
	}
	if err != nil {
		return Request{}, err
	}
	if fields["request_id"] != nil {
		if err := checkRequestID(r.RequestID); err != nil {
			return Request{}, err
		}
	}
	if err := checkRequester(r.RequestedBy); err != nil {
		return Request{}, err
	}
	delete(fields, "request_id")
	delete(fields, "requested_by")
	p, err := k.Decode(owned.NewInput(job.SourceKafka, key, fields, false))
	if err != nil {
		return Request{}, owned.RejectionOf(err)
	}
	r.Params = p
	return r, nil
}

// decodeObject checks the value's size and shape and returns its members.
func decodeObject(value []byte, maxBytes int) (map[string]json.RawMessage, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxRecordBytes
	}
	if len(value) > maxBytes {
		return nil, owned.Reject(owned.ReasonTooLarge, "value is %d bytes, limit %d", len(value), maxBytes)
	}
	if !utf8.Valid(value) {
		return nil, owned.Reject(owned.ReasonMalformedJSON, "value is not valid UTF-8")
	}
	trimmed := bytes.TrimSpace(value)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return nil, owned.Reject(owned.ReasonMalformedJSON, "value is not a JSON object")
	}
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(trimmed))
	if err := dec.Decode(&fields); err != nil {
		return nil, owned.Reject(owned.ReasonMalformedJSON, "%v", err)
	}
	if dec.More() {
		return nil, owned.Reject(owned.ReasonMalformedJSON, "trailing data after the JSON object")
	}
	if err := owned.RejectDuplicateKeys(trimmed); err != nil {
		return nil, err
	}
	return fields, nil
}

// envelope reads an optional string member; null is absent.
func envelope(fields map[string]json.RawMessage, name string) (string, error) {
	raw, ok := fields[name]
	if !ok {
		return "", nil
	}
	var s *string
	if err := json.Unmarshal(raw, &s); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return "", owned.Reject(owned.ReasonMalformedJSON, "field %q must be a string, got %s", name, te.Value)
		}
		return "", owned.Reject(owned.ReasonMalformedJSON, "field %q: %v", name, err)
	}
	if s == nil {
		delete(fields, name)
		return "", nil
	}
	return *s, nil
}

// checkRequestID accepts 1..128 characters from [A-Za-z0-9._:/-], so request
// ids print cleanly in logs, events and headers. An absent request_id is
// fine (the consumer derives one); an empty string is not.
func checkRequestID(id string) error {
	if id == "" {
		return owned.Reject(owned.ReasonBadRequestID, "request_id is empty (omit it to have one derived)")
	}
	if len(id) > maxIDLen {
		return owned.Reject(owned.ReasonBadRequestID, "request_id is %d bytes, limit %d", len(id), maxIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == ':' || c == '/' || c == '-'
		if !ok {
			return owned.Reject(owned.ReasonBadRequestID, "request_id has character %q at %d (allowed: A-Z a-z 0-9 . _ : / -)", c, i)
		}
	}
	return nil
}

// checkRequester accepts up to 128 bytes of printable characters.
func checkRequester(by string) error {
	if len(by) > maxIDLen {
		return owned.Reject(owned.ReasonBadRequester, "requested_by is %d bytes, limit %d", len(by), maxIDLen)
	}
	for _, c := range by {
		if !unicode.IsPrint(c) {
			return owned.Reject(owned.ReasonBadRequester, "requested_by has unprintable character %q", c)
		}
	}
	return nil
}

// DLQMaxValueBytes, DLQMaxKeyBytes and DLQMaxHeaderBytes bound the
// dead-letter copy of a record: the first bytes of its value and key (size
// and sha256 in headers) and its headers when they fit, so that a record of
// any size can be dead-lettered (the copy stays far below the producer's
// ~1 MB record limit).
const (
	DLQMaxValueBytes  = 64 << 10
	DLQMaxKeyBytes    = 4 << 10
	DLQMaxHeaderBytes = 64 << 10
)

// DefaultMaxDecompressBatchBytes bounds what one fetched batch may
// decompress to (8 MiB): a producer's batch is at most ~1 MiB compressed,
// triggers are small JSON objects, and franz-go's own default (1 GiB) lets
// a compressed bomb exhaust memory.
const DefaultMaxDecompressBatchBytes = 8 << 20
