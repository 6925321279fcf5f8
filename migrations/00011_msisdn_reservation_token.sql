-- MSISDN reservation tokens (issue 13, item 5): Reserve writes a fresh random
-- token and returns it; Allocate and Release match it, so a caller whose
-- reservation expired and was swept cannot allocate or release the number
-- once another caller reserved it again. The token stays on the ALLOCATED
-- row (a retried Allocate with it succeeds) and is cleared when the number
-- goes back to FREE (Release, the sweep). NULL: no reservation made through
-- Reserve (rows from before this migration, rows other writers insert);
-- such a reservation cannot be allocated or released by token.

-- +goose Up
alter table msisdn_pool add column reservation_token text;

-- +goose Down
alter table msisdn_pool drop column reservation_token;
