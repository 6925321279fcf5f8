-- The console's other tables (issue 26).
--
-- ownership_events: every event of the events topic, indexed for the
-- console by the replicas' one consumer group (<COORDINATOR_KAFKA_GROUP>-console):
-- each record is written once, whichever replica emitted it, with its
-- partition and offset. Events of one lock key share a partition (the
-- topic is keyed by lock key), so (topic_partition, topic_offset) is the
-- order Kafka gave them. A re-published run.completed has the id of the
-- first and is kept once. Rows older than COORDINATOR_CONSOLE_RETENTION
-- are deleted.
--
-- replica_heartbeats: one row per replica, upserted every
-- COORDINATOR_CONSOLE_HEARTBEAT_INTERVAL: its version, start, dependency
-- checks, readiness and the runs it has in flight with their progress.
-- stopped_at is set by a clean shutdown. Rows not seen for a day go.
--
-- console_sessions: the console's logins. id_hash is the SHA-256 of the
-- cookie's random session id (the id itself is never stored), principal
-- the admin token's name, scopes its scopes at login, csrf the form token
-- of the session. Logout deletes the row; expired rows are deleted.

-- +goose Up
create table ownership_events (
    id              text        primary key,
    topic_partition integer     not null,
    topic_offset    bigint      not null,
    type            text        not null,
    run_key         text        not null,
    job             text,
    replica         text,
    event_time      timestamptz not null,
    reason          text,
    data            jsonb       not null,
    indexed_at      timestamptz not null default now()
);
create index ownership_events_key on ownership_events (run_key, topic_partition, topic_offset);
create index ownership_events_time on ownership_events (event_time);
create index ownership_events_rejected on ownership_events (event_time) where type = 'trigger.rejected';

create table replica_heartbeats (
    replica      text        primary key,
    version      text        not null default '',
    started_at   timestamptz not null,
    seen_at      timestamptz not null,
    stopped_at   timestamptz,
    ready        boolean     not null default false,
    dependencies jsonb       not null default '[]',
    runs         jsonb       not null default '[]'
);

create table console_sessions (
    id_hash    bytea       primary key,
    principal  text        not null,
    scopes     text        not null,
    csrf       text        not null,
    created_at timestamptz not null default now(),
    expires_at timestamptz not null
);
create index console_sessions_expires_at on console_sessions (expires_at);

-- +goose Down
drop table console_sessions;
drop table replica_heartbeats;
drop table ownership_events;
