-- Settings for many queues at once. A queue has settings of its own once an operator gave it
-- some (`configured`); the others follow the settings of the longest name prefix they start
-- with (`queue_prefixes`, set as `PUT /api/v1/queues/agent-*`), else the defaults. A queue's
-- pause and rate-limit bucket are always its own.
ALTER TABLE queues ADD COLUMN configured INTEGER NOT NULL DEFAULT 0;
-- Before prefixes, a queue's settings were its own: keep those that differ from the defaults.
UPDATE queues SET configured = 1
    WHERE mode <> 'parallel' OR priority <> 0 OR concurrency IS NOT NULL
       OR max_wait_ms <> 300000 OR rate_tokens IS NOT NULL;
CREATE TABLE queue_prefixes (
    namespace   TEXT NOT NULL,
    prefix      TEXT NOT NULL,                  -- the pattern without its `*` ('' for `*`)
    mode        TEXT NOT NULL,                  -- parallel | serial
    priority    INTEGER NOT NULL,
    concurrency INTEGER,                        -- most running tasks per queue; NULL: no limit
    max_wait_ms INTEGER NOT NULL,
    rate_tokens INTEGER,                        -- rate limit per queue; NULL: none
    rate_per_ms INTEGER,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (namespace, prefix)
);
