-- OpenTelemetry traces (`--otlp-endpoint`): the trace a job's spans belong to, the job span's id
-- and the span it continues (a submitter's `traceparent`), as lowercase hex. Written at submit
-- only while tracing is on; NULL otherwise.
ALTER TABLE jobs ADD COLUMN trace_id TEXT;
ALTER TABLE jobs ADD COLUMN span_id TEXT;
ALTER TABLE jobs ADD COLUMN parent_span_id TEXT;
