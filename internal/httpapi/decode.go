package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/telco-platform/coordinator/internal/job"
)

// DefaultMaxBodyBytes bounds a request body (64 KiB, like a Kafka trigger).
const DefaultMaxBodyBytes = 64 << 10

// maxIDLen bounds request_id and requested_by.
const maxIDLen = 128

// maxPeriodLen is generous for YYYY-MM; the dispatcher validates the value.
const maxPeriodLen = 32

// BillRunRequest is the body of POST /v1/billruns.
type BillRunRequest struct {
	Period      string `json:"period"`
	RequestID   string `json:"request_id,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
}

// SweepRequest is the optional body of POST /v1/msisdn-reaper/sweeps.
type SweepRequest struct {
	RequestID   string `json:"request_id,omitempty"`
	RequestedBy string `json:"requested_by,omitempty"`
}

// ErrBodyTooLarge is returned when a body passes the size limit.
var ErrBodyTooLarge = errors.New("httpapi: request body too large")

// DecodeBillRunRequest reads one JSON object from body: unknown fields,
// trailing data, a missing period and malformed ids are bad input (errors
// wrap job.ErrBadInput and say what was wrong). It does not judge the
// period's value: the dispatcher does (billrun.ParsePeriod).
func DecodeBillRunRequest(body []byte) (BillRunRequest, error) {
	var req BillRunRequest
	if err := decodeStrict(body, &req, false); err != nil {
		return BillRunRequest{}, err
	}
	if req.Period == "" {
		return BillRunRequest{}, job.BadInput("period is required (YYYY-MM)")
	}
	if err := checkText("period", req.Period, maxPeriodLen); err != nil {
		return BillRunRequest{}, err
	}
	if err := checkIDs(req.RequestID, req.RequestedBy); err != nil {
		return BillRunRequest{}, err
	}
	return req, nil
}

// DecodeSweepRequest reads the optional body of a sweep request: empty is
// fine; otherwise one JSON object with only request_id and requested_by.
func DecodeSweepRequest(body []byte) (SweepRequest, error) {
	var req SweepRequest
	if err := decodeStrict(body, &req, true); err != nil {
		return SweepRequest{}, err
	}
	if err := checkIDs(req.RequestID, req.RequestedBy); err != nil {
		return SweepRequest{}, err
	}
	return req, nil
}

func decodeStrict(body []byte, v any, emptyOK bool) error {
	if len(bytes.TrimSpace(body)) == 0 {
		if emptyOK {
			return nil
		}
		return job.BadInput("request body is empty; send a JSON object")
	}
	if !utf8.Valid(body) {
		return job.BadInput("request body is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return job.BadInput("request body is not the expected JSON object: %s", jsonProblem(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return job.BadInput("request body has data after the JSON object")
	}
	return nil
}

// jsonProblem turns a decoding error into a short, safe message (no echo of
// arbitrary input beyond what encoding/json itself quotes).
func jsonProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("syntax error at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return fmt.Sprintf("field %q must be a %s", typ.Field, typ.Type)
		}
		return fmt.Sprintf("expected a JSON object, got %s", typ.Value)
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return "unexpected end of input"
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		return "unknown field " + strings.TrimPrefix(err.Error(), "json: unknown field ")
	default:
		return "malformed JSON"
	}
}

func checkIDs(requestID, requestedBy string) error {
	if err := checkText("request_id", requestID, maxIDLen); err != nil {
		return err
	}
	return checkText("requested_by", requestedBy, maxIDLen)
}

// checkText accepts printable ASCII without spaces, so values print cleanly
// in logs, events and headers.
func checkText(field, v string, max int) error {
	if len(v) > max {
		return job.BadInput("%s is %d bytes, limit %d", field, len(v), max)
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f {
			return job.BadInput("%s has a disallowed character at byte %d (printable ASCII without spaces only)", field, i)
		}
	}
	return nil
}

// validRequestID reports whether a client-supplied X-Request-Id can be used
// as is; otherwise a fresh id is generated.
func validRequestID(v string) bool {
	return v != "" && checkText("request_id", v, maxIDLen) == nil
}
