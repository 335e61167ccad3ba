-- Task events for subscribers: what a subscription hears of (a JSON list of webhook event types;
-- those made before hear of job status changes only) and the steps its task events are limited
-- to (a JSON list of step ids; empty: every step).
ALTER TABLE webhooks ADD COLUMN events TEXT NOT NULL DEFAULT '["job.status_changed"]';
ALTER TABLE webhooks ADD COLUMN steps TEXT NOT NULL DEFAULT '[]';
