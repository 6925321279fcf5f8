// Package trigger turns Kafka records, cron ticks, HTTP calls and CLI runs
// into owned job runs through one dispatcher. It knows nothing of SQL: jobs
// (billrun, msisdnreaper) own their storage and their locks.
package trigger
