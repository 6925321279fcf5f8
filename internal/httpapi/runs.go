package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"

	"github.com/telco-platform/coordinator/internal/job"
	"github.com/telco-platform/coordinator/internal/owned"
	"github.com/telco-platform/coordinator/internal/ownership"
)

// The run endpoints: POST {path} starts a run (or answers why not), GET
// {path}/{id} reads one, GET /v1/locks lists the held locks.

// readBody reads the body under the size limit. It writes the problem and
// returns false when the body is too large, unreadable, or not declared
// JSON: a body needs a Content-Type of application/json (or +json); an
// empty body needs none.
func (a *API) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	ct := r.Header.Get("Content-Type")
	notJSON := func() ([]byte, bool) {
		writeProblem(w, r, newProblem(http.StatusUnsupportedMediaType, CodeUnsupportedMediaType,
			"send the body as application/json (with that Content-Type)"), 0)
		return nil, false
	}
	if ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return notJSON()
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeProblem(w, r, newProblem(http.StatusRequestEntityTooLarge, CodePayloadTooLarge,
				fmt.Sprintf("request body exceeds %d bytes", a.cfg.MaxBodyBytes)), 0)
			return nil, false
		}
		writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, "could not read the request body"), 0)
		return nil, false
	}
	if ct == "" && len(body) > 0 {
		return notJSON()
	}
	return body, true
}

func (a *API) refuseWhileDraining(w http.ResponseWriter, r *http.Request) bool {
	if !a.Draining() {
		return false
	}
	writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeShuttingDown,
		"this replica is shutting down and takes no new work; retry on another replica"), RetryAfterUnavailable)
	return true
}

// trigger builds the job trigger of an HTTP request: the body's request_id
// wins over X-Request-Id (already in the context); the body's requested_by
// over the token's name, which is always the principal.
func trigger(r *http.Request, requestID, requestedBy string) job.Trigger {
	if requestID == "" {
		requestID = requestIDFrom(r.Context())
	}
	principal := principalFrom(r.Context())
	if requestedBy == "" {
		requestedBy = principal
	}
	return job.Trigger{Source: job.SourceHTTP, RequestID: requestID, RequestedBy: requestedBy, Principal: principal}
}

// Accepted is the body of a 202 answer.
type Accepted struct {
	job.Result
	// Status is "started" (the run is owned, claimed and going on) or
	// "deferred" (it failed for a transient cause and its request is
	// recorded in run_requests: the resumer runs it).
	Status    string `json:"status"`
	StatusURL string `json:"status_url,omitempty"`
}

// postRun starts a run of k: decode the body (strict), then run it to its
// end, or for an HTTPAsync kind, until it is owned.
func (a *API) postRun(k owned.Kind) http.HandlerFunc {
	spec := k.Spec()
	return func(w http.ResponseWriter, r *http.Request) {
		if a.refuseWhileDraining(w, r) {
			return
		}
		body, ok := a.readBody(w, r)
		if !ok {
			return
		}
		req, err := DecodeRunRequest(k, body)
		if err != nil {
			writeProblem(w, r, rejectionProblem(err), 0)
			return
		}
		t := trigger(r, req.RequestID, req.RequestedBy)
		var (
			res     job.Result
			started bool
		)
		if spec.HTTPAsync {
			res, started, err = a.cfg.Dispatcher.Start(r.Context(), k, req.Params, t)
		} else {
			ctx, cancel := context.WithTimeout(r.Context(), a.cfg.SyncTimeout)
			res, err = a.cfg.Dispatcher.Run(ctx, k, req.Params, t)
			cancel()
		}
		var ce *job.CapacityError
		switch {
		case errors.As(err, &ce):
			writeProblem(w, r, newProblem(http.StatusTooManyRequests, CodeTooManyRuns,
				fmt.Sprintf("this replica has %d runs in flight, its cap (COORDINATOR_MAX_RUNS_IN_FLIGHT=%d); nothing was started: retry later or on another replica",
					ce.InFlight, ce.Limit)), RetryAfterAtCapacity)
			return
		case err != nil && (a.Draining() || res.Outcome == job.OutcomeUnavailable):
			// The dispatcher refused the work (it is shutting down).
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeShuttingDown,
				"this replica takes no new work; retry on another replica"), RetryAfterUnavailable)
			return
		case err != nil:
			a.log.Warn("http_run_error", "job", spec.Name, "request_id", t.RequestID, "error", err)
			writeProblem(w, r, newProblem(http.StatusInternalServerError, CodeInternal, "the run could not be started"), 0)
			return
		}
		if !started && res.Deferred && res.Outcome == job.OutcomeFailed {
			// Failed for a transient cause, and recorded for the resumer:
			// accepted, the resumer owes the run.
			writeJSON(w, http.StatusAccepted, Accepted{Result: res, Status: "deferred"})
			return
		}
		if !started {
			a.writeResult(w, r, res)
			return
		}
		acc := Accepted{Result: res, Status: "started"}
		if id, ok := k.StatusID(req.Params); ok {
			acc.StatusURL = spec.HTTPPath + "/" + url.PathEscape(id)
			w.Header().Set("Location", acc.StatusURL)
		}
		writeJSON(w, http.StatusAccepted, acc)
	}
}

// writeResult answers with a final job result: 200 for completed and
// already_completed, a problem document otherwise.
func (a *API) writeResult(w http.ResponseWriter, r *http.Request, res job.Result) {
	var p Problem
	retry := 0
	switch res.Outcome {
	case job.OutcomeCompleted, job.OutcomeAlreadyCompleted:
		writeJSON(w, http.StatusOK, res)
		return
	case job.OutcomeAlreadyOwned:
		detail := fmt.Sprintf("%s is owned by another replica", res.Key)
		if res.Owner != "" {
			detail = fmt.Sprintf("%s is owned by %s", res.Key, res.Owner)
		}
		p = newProblem(http.StatusConflict, CodeLockAcquisitionFailed, detail)
		p.Reason = string(ownership.ReasonAlreadyOwned)
		p.Owner = res.Owner
	case job.OutcomeUnavailable:
		p = newProblem(http.StatusServiceUnavailable, CodeLockAcquisitionFailed,
			withCause("the lock backend is unavailable; nothing was run", res.Error))
		p.Reason = string(ownership.ReasonUnavailable)
		retry = RetryAfterUnavailable
	case job.OutcomeLost:
		p = newProblem(http.StatusServiceUnavailable, CodeOwnershipLost,
			withCause("ownership was lost before the work finished; a later trigger resumes it", res.Error))
		p.Reason = "lost"
		p.Owner = res.Owner
		retry = RetryAfterUnavailable
	default:
		if res.BadInput {
			p = newProblem(http.StatusUnprocessableEntity, CodeBadInput, withCause("the run was refused", res.Error))
			p.Reason = "bad_input"
			break
		}
		if res.Retryable {
			// A dependency failed transiently (Postgres down, say) and the
			// request could not be recorded for the resumer: nothing owes
			// the run, so the caller must send it again. Never a 500.
			p = newProblem(http.StatusServiceUnavailable, CodeBackendUnavailable, withCause(
				"the run failed for a transient cause and the request was not recorded; nothing will run it: send it again", res.Error))
			p.Reason = string(res.Outcome)
			retry = RetryAfterUnavailable
			break
		}
		p = newProblem(http.StatusInternalServerError, CodeRunFailed, withCause("the run failed", res.Error))
		p.Reason = string(res.Outcome)
	}
	p.LockKey = res.Key
	writeProblem(w, r, p, retry)
}

func withCause(msg, cause string) string {
	if cause == "" {
		return msg
	}
	return msg + ": " + cause
}

// getStatus answers GET {path}/{id} for k.
func (a *API) getStatus(k owned.Kind) http.HandlerFunc {
	name := k.Spec().Name
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := checkText("id", id, maxPathIDLen); err != nil {
			writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, err.Error()), 0)
			return
		}
		st, err := a.cfg.Dispatcher.Status(r.Context(), k, id)
		switch {
		case err == nil:
			writeJSON(w, http.StatusOK, st)
		case errors.Is(err, job.ErrBadInput):
			writeProblem(w, r, newProblem(http.StatusBadRequest, CodeBadInput, err.Error()), 0)
		case errors.Is(err, owned.ErrNotFound):
			writeProblem(w, r, newProblem(http.StatusNotFound, CodeNotFound, fmt.Sprintf("no %s run %s", name, id)), 0)
		default:
			a.log.Warn("http_status_error", "job", name, "id", id, "error", err)
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeBackendUnavailable,
				name+" state could not be read: "+err.Error()), RetryAfterUnavailable)
		}
	}
}

func (a *API) getLocks(w http.ResponseWriter, r *http.Request) {
	locks := []ownership.LockInfo{}
	if a.cfg.Locks != nil {
		got, err := a.cfg.Locks.Locks(r.Context())
		if err != nil {
			a.log.Warn("http_locks_error", "error", err)
			writeProblem(w, r, newProblem(http.StatusServiceUnavailable, CodeBackendUnavailable,
				"locks could not be listed: "+err.Error()), RetryAfterUnavailable)
			return
		}
		if got != nil {
			locks = got
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"locks": locks})
}
