package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"unicode/utf8"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
)

// DefaultMaxBodyBytes bounds a request body (64 KiB, like a Kafka trigger).
const DefaultMaxBodyBytes = 64 << 10

// maxIDLen bounds request_id and requested_by.
const maxIDLen = 128

// maxPathIDLen bounds a run id in a path; the kind judges its value.
const maxPathIDLen = 64

// RunRequest is a decoded POST body: the envelope every trigger shares and
// the kind's Params.
type RunRequest struct {
	Params      owned.Params
	RequestID   string
	RequestedBy string
}

// ErrBodyTooLarge is returned when a body passes the size limit.
var ErrBodyTooLarge = errors.New("httpapi: request body too large")

// DecodeRunRequest reads the body of POST {path} for kind k: empty, or one
// JSON object with the optional request_id and requested_by and the kind's
// own fields, which k.Decode judges. Unknown fields, trailing data, a member
// given twice (duplicate_key) and malformed ids are bad input (errors wrap job.ErrBadInput and say what
// was wrong).
func DecodeRunRequest(k owned.Kind, body []byte) (RunRequest, error) {
	var fields map[string]json.RawMessage
	if err := decodeStrict(body, &fields, true); err != nil {
		return RunRequest{}, err
	}
	if err := owned.RejectDuplicateKeys(body); err != nil {
		return RunRequest{}, err
	}
	if fields == nil {
		fields = map[string]json.RawMessage{}
	}
	var req RunRequest
	for name, dst := range map[string]*string{"request_id": &req.RequestID, "requested_by": &req.RequestedBy} {
		raw, ok := fields[name]
		if !ok {
			continue
		}
		delete(fields, name)
		var v *string
		if err := json.Unmarshal(raw, &v); err != nil {
			return RunRequest{}, job.BadInput("field %q must be a string", name)
		}
		if v != nil {
			*dst = *v
		}
	}
	if err := checkIDs(req.RequestID, req.RequestedBy); err != nil {
		return RunRequest{}, err
	}
	p, err := k.Decode(owned.NewInput(job.SourceHTTP, nil, fields, true))
	if err != nil {
		return RunRequest{}, err
	}
	req.Params = p
	return req, nil
}

// rejectionProblem is the problem document of a trigger that is refused as
// it is decoded: 400 BAD_INPUT, or 422 for a kind's rejection of
// well-formed input it cannot run as asked (a bill run's period that has not
// ended yet), with the rejection's reason and fields.
func rejectionProblem(err error) Problem {
	var re *owned.RejectError
	if !errors.As(err, &re) {
		return newProblem(http.StatusBadRequest, CodeBadInput, err.Error())
	}
	status := http.StatusBadRequest
	if re.Unprocessable {
		status = http.StatusUnprocessableEntity
	}
	p := newProblem(status, CodeBadInput, re.Detail)
	p.Reason, p.Fields = re.Reason, re.Fields
	return p
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
